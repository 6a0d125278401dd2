"""nb30_moe_router_mismatch and modeling.routing_replay: the routers found and their contract checked, a replay of a model's
own routes changing nothing (Mixtral: renormalised top-k; Qwen2-MoE: not), the experts receiving exactly the recorded
routes, the bf16-sampler/fp32-trainer mismatch with the trainer's own routes and its reduction under replay, the verdict
both ways, clear errors for dense and unsupported models, metrics(), figures and the explorer."""

import copy

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.experiments.checkpoints import load
from workbench.modeling.routing_replay import RoutingHooks, moe_routers, route_disagreement
from workbench.modeling.scoring import token_logprobs
from workbench.modeling.tiny import tiny_model
from workbench.pitfalls import nb30_moe_router_mismatch as rm
from workbench.tasks import encode_prompts, rl_problems
from workbench.viz import legibility


@pytest.fixture(scope="module")
def mixtral():
    return load("tiny-mixtral")


@pytest.fixture(scope="module")
def result(mixtral):
    model, tokenizer = mixtral
    return rm.router_mismatch(model, tokenizer, [p.prompt for p in rl_problems(16)], max_new_tokens=8, seed=0)


def qwen2_moe():
    """A tiny Qwen2-MoE (top-2 of 8 not renormalised, a shared expert), built from its transformers config."""
    from transformers import AutoModelForCausalLM, Qwen2MoeConfig

    _, tokenizer = tiny_model("qwen2")
    config = Qwen2MoeConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                            shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, initializer_range=0.1,
                            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config).eval(), tokenizer


def batch(tokenizer, n: int = 6):
    ids, mask = encode_prompts(tokenizer, [p.prompt for p in rl_problems(n)])
    return ids, mask


@pytest.mark.parametrize("build, renormalised", [(lambda: load("tiny-mixtral"), True), (qwen2_moe, False)], ids=["mixtral", "qwen2_moe"])
@torch.no_grad()
def test_replaying_a_models_own_routes_changes_nothing(build, renormalised):
    model, tokenizer = build()
    ids, mask = batch(tokenizer)
    with RoutingHooks(model) as own:
        plain = token_logprobs(model, ids, mask)
    assert len(own.routes) == model.config.num_hidden_layers and set(own.renormalised.values()) == {renormalised}
    with RoutingHooks(model, "replay", own.routes) as replay:
        replayed = token_logprobs(model, ids, mask)
    torch.testing.assert_close(replayed, plain, atol=1e-5, rtol=1e-5)  # the weights recomputed exactly as the router does
    assert all(torch.equal(replay.routes[n], own.routes[n]) for n in own.routes)


@torch.no_grad()
def test_the_experts_receive_exactly_the_recorded_routes(mixtral):
    model, tokenizer = mixtral
    ids, mask = batch(tokenizer)
    engine = copy.deepcopy(model).to(torch.bfloat16)
    with RoutingHooks(engine) as sampler:
        token_logprobs(engine, ids, mask)
    received, handles = {}, []
    for name in sampler.routes:  # what each layer's experts module is called with: (hidden, top_k_index, top_k_weights)
        experts = model.get_submodule(name.rsplit(".", 1)[0] + ".experts")
        handles.append(experts.register_forward_pre_hook(lambda m, args, name=name: received.__setitem__(name, args[1].clone())))
    try:
        with RoutingHooks(model, "replay", sampler.routes) as replay:
            token_logprobs(model, ids, mask)
    finally:
        for handle in handles:
            handle.remove()
    assert all(torch.equal(received[n], sampler.routes[n]) for n in sampler.routes)
    assert route_disagreement(sampler.routes, replay.own_routes).any()  # the trainer alone would have routed otherwise


def test_bf16_sampler_and_fp32_trainer_route_differently_and_replay_closes_the_gap(result):
    bug, fix = result["routing"]["recompute"], result["routing"]["replay"]
    assert result["model_type"] == "mixtral" and result["experts"] == 16 and result["top_k"] == 4 and result["renormalised"]
    assert 0.01 < bug["router_disagreement"] < 0.2 and bug["any_layer"] > 0.05  # the signature with the switch on
    assert bug["any_layer"] >= max(bug["per_layer"]) and bug["cumulative_any_layer"][-1] == bug["any_layer"]
    assert bug["mean_gap"] > 5e-3 and bug["max_gap"] > 0.05
    assert fix["router_disagreement"] == 0 and fix["any_layer"] == 0 and result["replayed_identical"]  # the fix
    assert fix["mean_gap"] < 0.7 * bug["mean_gap"] and fix["max_gap"] < 0.5 * bug["max_gap"]
    assert fix["mean_gap"] > 1e-4  # what replay leaves is the bf16 arithmetic (P12), not 0
    flipped, kept = result["margin"][result["differ"]["recompute"]], result["margin"][~result["differ"]["recompute"]]
    assert flipped.median() < 0.1 * kept.median()  # routes flip where the k-th and (k+1)-th experts nearly tie
    assert rm.verdict(result) == (True, True) and rm.not_shown(result) is None


def synthetic(bug_share: float, bug_gaps: list[float], fix_gaps: list[float]) -> dict:
    n = len(bug_gaps)
    differ = {"recompute": torch.rand(n, 2, generator=torch.Generator().manual_seed(0)) < bug_share,
              "replay": torch.zeros(n, 2, dtype=torch.bool)}
    log_ratio = {"recompute": torch.tensor(bug_gaps), "replay": torch.tensor(fix_gaps)}
    return {"tokens": n, "layers": ["a", "b"], "replayed_identical": True, **rm.summarise(differ, log_ratio)}


def test_verdict_is_false_on_bug_free_numbers_and_when_flips_move_nothing_measurable():
    agree = synthetic(0.0, [2e-3] * 40, [2e-3] * 40)  # no route flips: only the bf16 gap, equal both ways
    assert rm.verdict(agree) == (False, False) and "no route" in rm.not_shown(agree)
    assert "no router mismatch shown" in rm.headline_sentence(agree)
    shown = synthetic(0.3, [2e-3, 5e-2] * 20, [2e-3] * 40)
    assert rm.verdict(shown) == (True, True) and rm.not_shown(shown) is None
    assert rm.verdict({**shown, "replayed_identical": False}) == (True, False)  # a replay that did not force the routes
    harmless = synthetic(0.3, [2e-3] * 40, [2e-3] * 40)  # routes flipped where no scored log-prob moved
    assert rm.verdict(harmless) == (False, False) and "barely move" in rm.not_shown(harmless)
    noisy = synthetic(0.3, [2e-3, 5e-2] * 2, [2e-3, 5e-2, 2e-3, 2e-3])  # 4 tokens: a reduction within its noise
    assert rm.verdict(noisy) == (False, True) and "standard errors" in rm.not_shown(noisy)


def test_dense_and_unsupported_models_are_clear_errors():
    dense, tokenizer = load("tiny-qwen2")
    assert "dense model" in rm.dense_reason(dense) and "qwen2" in rm.dense_reason(dense)
    with pytest.raises(ValueError, match="model_type 'qwen2'.*dense model"):
        moe_routers(dense)
    with pytest.raises(ValueError, match="model_type 'qwen2'.*dense model"):
        rm.router_mismatch(dense, tokenizer, ["1+1="], max_new_tokens=2)
    declared = copy.deepcopy(dense)
    declared.config.num_experts = 8  # an MoE by its config, with no router of the supported contract
    assert rm.dense_reason(declared) is None
    with pytest.raises(ValueError, match="model_type 'qwen2'.*declares 8 experts.*supported model types"):
        moe_routers(declared)


def test_a_router_with_another_contract_or_a_wrong_replay_is_refused(mixtral):
    model, tokenizer = mixtral
    ids, mask = batch(tokenizer)
    with pytest.raises(ValueError, match="mode="):
        RoutingHooks(model, "force")
    with pytest.raises(ValueError, match="needs routes"):
        RoutingHooks(model, "replay")
    with torch.no_grad(), RoutingHooks(model) as own:
        token_logprobs(model, ids, mask)
    with pytest.raises(ValueError, match="no entry for router"):
        RoutingHooks(model, "replay", dict(list(own.routes.items())[1:]))
    shorter = {n: r[: len(r) // 2] for n, r in own.routes.items()}
    with pytest.raises(ValueError, match="same batch layout"), torch.no_grad(), RoutingHooks(model, "replay", shorter):
        token_logprobs(model, ids, mask)
    odd = copy.deepcopy(model)
    gate = odd.get_submodule(next(iter(own.routes)))
    gate.forward = lambda hidden: torch.nn.functional.linear(hidden.reshape(-1, gate.hidden_dim), gate.weight)  # logits only
    with pytest.raises(ValueError, match="model_type 'mixtral'.*cannot be replayed"), torch.no_grad(), RoutingHooks(odd):
        odd(ids, attention_mask=mask)


def test_metrics_figures_and_explorer(result):
    kwargs = rm.metrics(result)
    check_metrics(kwargs, "30_moe_router_mismatch")
    assert kwargs["headline"]["bug"] == result["routing"]["recompute"]["mean_gap"] > kwargs["headline"]["fix"]
    assert not {"differ", "margin", "log_ratio"} & set(kwargs["metrics"]) and kwargs["not_shown"] is None  # no tensors
    fig = rm.figure_router_mismatch(result)
    assert legibility.check_figure(fig).problems() == []
    assert f"{result['experts']} experts" in rm.router_note(result)
    assert drew(fig)
    assert len(rm.result_lines(result).splitlines()) == 4
    assert "0 routes different" in rm.headline_sentence(result)
    explorer = rm.router_explorer(result)
    assert explorer.renders == 1 and explorer.last["disagreement"] == result["routing"]["recompute"]["router_disagreement"]
    explorer.controls["routing"].value = "replay"
    assert explorer.renders == 2 and explorer.last["disagreement"] == 0
    explorer.controls["layer"].value = "2"
    assert explorer.last["disagreement"] == 0 and explorer.last["layer"] == "2"
