"""nb37_lora_sync: the LoRA wrapper and both payloads on the tiny model, a short real sync run (bug and fix, two
intervals, two seeds: slow), the verdict both ways, metrics(), printers, figures and the explorer on synthetic histories."""

import copy

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.pitfalls import nb37_lora_sync as ls
from workbench.tasks import rl_problems
from workbench.viz import legibility


@pytest.fixture(scope="module")
def result(qwen):
    model, tokenizer = qwen
    return ls.sync_runs(model, tokenizer, rl_problems(32), intervals=[1, 2], seeds=[0, 1], steps=4, lr=2e-3)


def test_merged_payload_is_the_trainers_policy_and_base_payload_the_initial_one(qwen):
    model, tokenizer = qwen
    trainer = ls.with_lora(copy.deepcopy(model), seed=3)
    with torch.no_grad():
        for module in trainer.modules():
            if isinstance(module, ls.LoRALinear):
                module.lora_B.weight.normal_(0, 0.05)  # a trained adapter
    ids = torch.tensor([[1, 20, 21, 22, 23]])
    merged, base = copy.deepcopy(model), copy.deepcopy(model)
    ls.push_for("merged")(trainer, merged)
    ls.push_for("base")(trainer, base)
    with torch.no_grad():
        want = trainer(input_ids=ids).logits
        assert (merged(input_ids=ids).logits - want).abs().max() < 1e-4  # the fix: the sampler computes the trainer's policy
        assert torch.equal(base(input_ids=ids).logits, model(input_ids=ids).logits)  # the bug: the initial policy, exactly
        assert (base(input_ids=ids).logits - want).abs().max() > 1e-2
    summary = {p: ls.payload_summary(trainer, p) for p in ls.PAYLOADS}
    assert summary["base"]["lora_tensors"] == 0 and summary["merged"]["lora_tensors"] == 0
    assert summary["base"]["max_distance_to_policy"] > 1e-3 and summary["merged"]["max_distance_to_policy"] == 0
    assert summary["base"]["tensors"] == summary["merged"]["tensors"] == len(model.state_dict())


def test_switch_and_wrapper_name_their_problem():
    with pytest.raises(ValueError, match="payload"):
        ls.push_for("adapter")
    with pytest.raises(ValueError, match="no nn.Linear"):
        ls.with_lora(torch.nn.Sequential(torch.nn.ReLU()))


@pytest.mark.slow
def test_the_bugs_gap_grows_identically_at_every_interval_and_the_fix_resets_it(result):
    assert ls.interval_response(result, "base") == 0  # the sampler never changes: the interval changes nothing
    assert ls.interval_response(result, "merged") > 1e-3  # the fix's gap moves with the interval
    assert ls.synced_gap(result, "merged") < 1e-4  # right after a sync the sampler is the trainer (float noise)
    assert ls.drift_match(result) < 1e-4  # the bug's gap is the trainer's drift from the initial policy
    head = ls.headline_row(result)
    assert head["bug"] > 1e-2 > head["first_gap"] and head["bug"] > head["fix"]
    assert ls.verdict(result) == (True, True) and ls.not_shown(result) is None


def synthetic(base_gaps, merged_gaps, intervals=(1, 2)) -> dict:
    """A result whose runs have the given per-step gaps (drift = KL = gap): a list for every interval, or a dict
    ``{interval: list}``; the second seed's gaps are 10 % larger."""
    def runs(gaps, k):
        gaps = gaps[k] if isinstance(gaps, dict) else gaps
        return [[{"step": t, "gap": g * scale, "kl": g, "drift": g} for t, g in enumerate(gaps)] for scale in (1.0, 1.1)]
    return {"runs": {**{("base", k): runs(base_gaps, k) for k in intervals}, **{("merged", k): runs(merged_gaps, k) for k in intervals}},
            "payloads": {p: {"payload": p, "tensors": 10, "lora_tensors": 0, "max_distance_to_policy": 0.0} for p in ls.PAYLOADS},
            "intervals": list(intervals), "seeds": [0, 1], "steps": 4}


SYNCED = {1: [0.0, 0.0, 0.0, 0.0], 2: [0.0, 0.1, 0.0, 0.1]}  # a working sync: 0 after each push, growing between pushes


def test_verdict_fails_on_bug_free_and_on_unfixed_numbers():
    grows = [0.0, 0.1, 0.2, 0.3]
    assert ls.verdict(synthetic(grows, SYNCED)) == (True, True)
    assert ls.verdict(synthetic(SYNCED, SYNCED))[0] is False  # the base payload synced after all: no signature
    small = [0.0, 1e-3, 2e-3, 3e-3]  # too small to tell from a synced sampler
    assert ls.verdict(synthetic(small, SYNCED))[0] is False
    assert "moved this checkpoint's policy by only" in ls.not_shown(synthetic(small, SYNCED))
    assert ls.verdict(synthetic(grows, grows))[1] is False  # the fix's gap never falls back at a sync
    flat = synthetic(small, SYNCED)
    for runs in flat["runs"].values():
        for run in runs:
            for h in run:
                h.update(reward=0.0, reward_spread=0.0)  # a checkpoint that never solves the task: no advantage, no update
    assert "every REINFORCE advantage is 0" in ls.not_shown(flat)


def test_metrics_printers_figures_and_explorer():
    result = synthetic([0.0, 0.1, 0.2, 0.3], SYNCED)
    kwargs = ls.metrics(result)
    check_metrics(kwargs, "37_lora_sync")
    assert kwargs["reproduced"] and kwargs["fixed"] and kwargs["headline"]["bug"] > kwargs["headline"]["fix"]
    assert kwargs["metrics"]["prediction"]["agrees"] in (True, False) and kwargs["metrics"]["interval_response"]["base"] == 0
    assert "0 of them lora_" in ls.payload_lines(result)
    assert len(ls.growth_lines(result).splitlines()) == 2 and "sync every 2" in ls.growth_lines(result)
    assert "identical, bit for bit" in ls.headline_sentence(result) and "(fixed)" in ls.headline_sentence(result)
    assert "ringed" in ls.lora_note(result)
    fig = ls.figure_lora_sync(result)
    assert legibility.check_figure(fig).problems() == [] and drew(fig)
    explorer = ls.sync_explorer(result)
    assert explorer.renders == 1 and explorer.last["interval"] == 2
    explorer.controls["measure"].value = "drift"
    assert explorer.renders == 2 and explorer.last["bug_tail"] > 0


def test_gpt2_conv1d_projections_take_an_adapter_and_merge_exactly():
    """GPT-2 stores its projections as transformers' Conv1D (weight (in, out)): wrapped and merged like nn.Linear."""
    import torch

    from workbench.experiments.checkpoints import load

    trainer, _ = load("tiny-arith-gpt2")
    sampler, _ = load("tiny-arith-gpt2")
    ls.with_lora(trainer)
    adapters = [m for m in trainer.modules() if isinstance(m, ls.LoRALinear)]
    assert adapters and all(m.transposed for m in adapters)
    for module in adapters:
        torch.nn.init.normal_(module.lora_B.weight, std=0.02, generator=torch.Generator().manual_seed(0))
    ls.push_for("merged")(trainer, sampler)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert float((trainer(ids).logits - sampler(ids).logits).abs().max()) < 1e-4
