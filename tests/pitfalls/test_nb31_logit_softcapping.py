"""nb31_logit_softcapping: the cap modes, the step-0 KL on the tiny Gemma-2-style model both ways, the verdict made
False on bug-free numbers, metrics(), figures and the explorer."""

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.experiments.checkpoints import load
from workbench.pitfalls import nb31_logit_softcapping as sc
from workbench.tasks import rl_problems

FIX, UNSLOTH, NONE = sc.CAP_MODES


@pytest.fixture(scope="module")
def rows():
    policy, tokenizer = load("tiny-gemma2")
    assert policy.config.final_logit_softcapping == 30.0
    return sc.spread_sweep(policy, tokenizer, [p.prompt for p in rl_problems(8)], [1.0, 20.0])


def test_softcap_modes():
    z = torch.tensor([-120.0, -1.0, 0.0, 1.0, 120.0])
    assert sc.softcap(z, 30.0, FIX).abs().max() < 30  # bounded
    assert torch.allclose(sc.softcap(z, 30.0, UNSLOTH)[[0, 4]], z[[0, 4]].abs(), rtol=1e-3)  # saturated tanh: the "cap" returns |z|
    assert torch.equal(sc.softcap(z, 30.0, NONE), z) and torch.equal(sc.softcap(z, None, FIX), z)
    with pytest.raises(ValueError, match="mode"):
        sc.softcap(z, 30.0, "tanh")


def test_step0_kl_to_an_identical_reference(rows):
    small, wide = rows
    assert wide[UNSLOTH]["kl"] > 1e-2 and wide[NONE]["kl"] > 1e-2  # the signature with the switch on
    assert all(r[FIX]["kl"] <= 1e-6 for r in rows)  # the model's own cap: KL 0 up to float noise
    assert wide[NONE]["min_logprob_policy"] < wide[FIX]["min_logprob_policy"]  # uncapped log-probs of sampled tokens fall lower
    assert small[UNSLOTH]["kl"] > 1e-2  # z·tanh(z/c) ≈ z²/c: wrong even far below the cap
    assert sc.verdict(rows) == (True, True)


def row(spread: float, kl: dict) -> dict:
    return {"spread": spread, **{m: {"kl": kl[m], "k3": kl[m], "cap": 30.0, "max_raw_logit": 4 * spread, "min_logprob_policy": -3.0}
                                 for m in sc.CAP_MODES}}


def test_verdict_is_false_on_bug_free_numbers():
    capped = [row(1.0, {FIX: 0.0, UNSLOTH: 0.0, NONE: 0.0}), row(20.0, {FIX: 0.0, UNSLOTH: 1e-7, NONE: 1e-7})]
    assert sc.verdict(capped) == (False, True)
    assert "every path agrees" in sc.headline_sentence(capped, sc.headline_row(capped))
    broken_fix = [row(20.0, {FIX: 0.1, UNSLOTH: 1.0, NONE: 1.0})]
    assert sc.verdict(broken_fix) == (True, False)


def test_metrics_figures_and_explorer(rows, tmp_path):
    head = sc.headline_row(rows)
    assert head is rows[-1]
    kwargs = sc.metrics(rows, head)
    check_metrics(kwargs, "31_logit_softcapping")
    assert kwargs["headline"]["bug"] == rows[-1][UNSLOTH]["kl"] and kwargs["headline"]["fix"] == rows[-1][FIX]["kl"]
    assert drew(sc.figure_softcapping(rows, head))
    assert len(sc.sweep_lines(rows).splitlines()) == len(rows)
    explorer = sc.softcap_explorer(30.0)
    assert explorer.renders == 1 and abs(explorer.last[FIX]) < 30 < explorer.last[UNSLOTH]
    explorer.controls["c"].value = 10.0
    assert explorer.renders == 2 and abs(explorer.last[FIX]) <= 10


@pytest.mark.parametrize("arch", ["gpt2", "qwen2", "gemma2"])
def test_a_model_without_a_cap_records_not_shown_instead_of_crashing(arch, tmp_path):
    """GPT-2 keeps its decoder in ``.transformer`` (no ``.model``), Qwen2 ties its head to the input embeddings, and a
    Gemma-2 config with ``final_logit_softcapping=None`` has no cap: each runs through, every mode's KL is 0, and the
    reason is recorded with its number."""
    from workbench.modeling.tiny import tiny_model

    overrides = {"final_logit_softcapping": None} if arch == "gemma2" else {}
    model, tokenizer = tiny_model(arch, **overrides)
    assert sc.final_logit_cap(model) is None
    rows = sc.spread_sweep(model, tokenizer, [p.prompt for p in rl_problems(4)], [1.0, 20.0])
    assert all(r[mode]["cap"] is None and r[mode]["kl"] <= 1e-6 for r in rows for mode in sc.CAP_MODES)
    assert rows[-1][FIX]["max_raw_logit"] > 30  # wide logits: a cap would have mattered, there is none
    head = sc.headline_row(rows)
    kwargs = sc.metrics(rows, head)
    check_metrics(kwargs, "31_logit_softcapping")
    assert (kwargs["reproduced"], kwargs["fixed"]) == (False, True)
    assert "no final-logit soft-cap (final_logit_softcapping is None)" in kwargs["not_shown"]
    assert "at most 0.0e+00 nats per token at raw logit std 20" in kwargs["not_shown"] and "cap none" in kwargs["headline"]["what"]
    assert "no final-logit soft-cap" in sc.headline_sentence(rows, head) and len(sc.sweep_lines(rows).splitlines()) == 2
    assert drew(sc.figure_softcapping(rows, head))
    assert sc.softcap_explorer(None).controls["c"].value == sc.GEMMA_CAP


def test_the_spread_rescales_only_the_logits_of_a_tied_head():
    from workbench.modeling.tiny import tiny_model
    from workbench.tasks import encode_prompts

    model, tokenizer = tiny_model("qwen2")  # tie_word_embeddings=True: the head is the input embedding matrix
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    ids, mask = encode_prompts(tokenizer, [p.prompt for p in rl_problems(4)])
    scaled = sc.with_logit_spread(model, ids, mask, 20.0)
    assert torch.equal(scaled.get_input_embeddings().weight, model.get_input_embeddings().weight)  # inputs untouched
    with torch.no_grad():
        std = float(scaled(input_ids=ids, attention_mask=mask).logits[mask.bool()].std())
    assert std == pytest.approx(20.0, rel=1e-3)  # the spread asked for, exactly (tied and rescaled: the inputs moved too)


def test_a_capped_model_is_never_excused_and_a_bad_cap_is_named(rows):
    head = sc.headline_row(rows)
    assert sc.not_shown(head) is None and sc.metrics(rows, head)["not_shown"] is None
    from workbench.modeling.tiny import tiny_model

    model, _ = tiny_model("gemma2")
    model.config.final_logit_softcapping = 0.0
    with pytest.raises(ValueError, match="final_logit_softcapping=0.0.*must be > 0"):
        sc.final_logit_cap(model)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_sweep_runs_on_a_gpu_model_with_prompts_encoded_on_the_cpu(rows):
    """Prompt ids built on the CPU reach a model on CUDA (the sweep moves them): the same numbers as on the CPU,
    within float noise."""
    policy, tokenizer = load("tiny-gemma2", device="cuda")
    on_gpu = sc.spread_sweep(policy, tokenizer, [p.prompt for p in rl_problems(8)], [1.0, 20.0])
    assert sc.verdict(on_gpu) == (True, True)
    for cpu_row, gpu_row in zip(rows, on_gpu, strict=True):
        assert gpu_row[NONE]["kl"] == pytest.approx(cpu_row[NONE]["kl"], rel=1e-3)
