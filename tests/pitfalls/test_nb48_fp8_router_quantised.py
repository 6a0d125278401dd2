"""nb48_fp8_router_quantised: the FP8 e4m3 round trip against hand-computed values, the ignore-list that misses the
router (the bug) vs the one that keeps it (the fix) on tiny-mixtral, a dense model's not_shown, the verdict both ways,
figures, explorer and metrics."""

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.experiments.checkpoints import load
from workbench.pitfalls import nb48_fp8_router_quantised as fr
from workbench.tasks import encode_prompts, rl_problems


@pytest.fixture(scope="module")
def mixtral_result():
    model, tokenizer = load("tiny-mixtral")
    ids, mask = encode_prompts(tokenizer, [p.prompt for p in rl_problems(16)])
    return model, fr.measure(model, tokenizer, ids, mask, granularities=("channel",))


def test_fp8_roundtrip_by_hand():
    # amax 448 → scale 1: e4m3 keeps 3 mantissa bits, so 1.0625 rounds to 1.0 and 17 to 16 (steps of 2 between 16 and 32)
    w = torch.tensor([[448.0, 1.0625, 17.0, -3.0]])
    assert fr.fp8_roundtrip(w).tolist() == [[448.0, 1.0, 16.0, -3.0]]
    # per channel: each row's amax maps to 448, so a small row keeps its relative precision
    rows = torch.tensor([[448.0, 1.0], [0.5, 0.25]])
    assert fr.fp8_roundtrip(rows, "channel")[1].tolist() == [0.5, 0.25]
    assert (fr.fp8_roundtrip(torch.zeros(2, 2)) == 0).all()
    with pytest.raises(ValueError, match="granularity"):
        fr.fp8_roundtrip(w, "block")


def test_ignore_lists_and_the_router_names(mixtral_result):
    model, _ = mixtral_result
    _, missed = fr.fp8_copy(model, fr.IGNORE_LISTS["router missed"])
    kept_copy, kept = fr.fp8_copy(model, fr.IGNORE_LISTS["router kept"])
    assert missed == [f"model.layers.{i}.mlp.gate.weight" for i in range(4)] and kept == []
    trained = dict(model.named_parameters())
    copied = dict(kept_copy.named_parameters())
    assert torch.equal(copied["model.layers.0.mlp.gate.weight"], trained["model.layers.0.mlp.gate.weight"])
    assert not torch.equal(copied["model.layers.0.mlp.experts.gate_up_proj"], trained["model.layers.0.mlp.experts.gate_up_proj"])
    _, alone = fr.fp8_copy(model, (), routers_only=True)
    assert alone == missed


def test_bug_and_fix_on_tiny_mixtral(mixtral_result):
    _, result = mixtral_result
    head = fr.headline(result, "channel")
    assert head["alone_disagreement"] > 0.05 and head["alone_gap"] > fr.MIN_GAP
    assert head["bug_disagreement"] > head["fix_disagreement"] > 0
    assert fr.verdict(head) == (True, True) and fr.not_shown(result) is None
    assert fr.verdict({**head, "quantised_routers_fix": 2})[1] is False
    assert fr.verdict({**head, "alone_disagreement": 0.0})[0] is False
    assert fr.verdict({**head, "moe": False}) == (False, True)
    assert fr.gap_significance({"gap_difference": 0.003, "gap_difference_se": 0.001})
    assert not fr.gap_significance({"gap_difference": 0.003, "gap_difference_se": 0.002})


def test_dense_model_is_not_shown(qwen):
    model, tokenizer = qwen
    ids, mask = encode_prompts(tokenizer, [p.prompt for p in rl_problems(8)])
    result = fr.measure(model, tokenizer, ids, mask, granularities=("channel",))
    head = fr.headline(result, "channel")
    assert not result["moe"] and "dense model" in fr.not_shown(result) and head["bug_gap"] == head["fix_gap"] > 0
    assert fr.verdict(head) == (False, True) and fr.headline_sentence(head).startswith("dense model")
    assert drew(fr.figure_fp8_router(result, ("channel",), "channel"))


def test_metrics_figures_lines_and_explorer(mixtral_result):
    from workbench.viz import legibility

    _, result = mixtral_result
    grans = ("channel",)
    head = fr.headline(result, "channel")
    kwargs = fr.metrics(result, head, grans, {})
    check_metrics(kwargs, "48_fp8_router_quantised")
    assert kwargs["reproduced"] and kwargs["fixed"] and kwargs["headline"]["bug"] > kwargs["headline"]["fix"] > 0
    fig = fr.figure_fp8_router(result, grans, "channel")
    assert drew(fig) and fig.get_size_inches()[0] <= 9.6 and legibility.check_figure(fig).problems() == []
    assert len(fr.variant_lines(result, grans).splitlines()) == 3
    assert "model.layers.3.mlp.gate.weight" in fr.routers_line(result, "channel")
    assert "router alone quantised flips" in fr.headline_sentence(head)
    explorer = fr.fp8_explorer({**result, ("router kept", "tensor"): result["router kept", "channel"],
                                ("router missed", "tensor"): result["router missed", "channel"],
                                ("router alone", "tensor"): result["router alone", "channel"]}, ("channel", "tensor"))
    assert explorer.renders == 1 and explorer.last["granularity"] == "channel" and explorer.last["panel"] == "entropy"
    explorer.controls["granularity"].value = "tensor"
    assert explorer.renders == 2 and explorer.last["granularity"] == "tensor"
    explorer.controls["panel"].value = "disagreement"
    assert explorer.renders == 3 and explorer.last["panel"] == "disagreement"
