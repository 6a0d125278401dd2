"""nb00_quickstart (notebook 00): the verdict on the drift per text, metrics(), the printed conclusion, the figure."""

from pitfall_fakes import check_metrics, drew

from workbench.core.batching import pad_sequences
from workbench.modeling.tiny import tiny_model
from workbench.pitfalls import nb00_quickstart as quickstart


def test_metrics_and_conclusion():
    policy, _ = tiny_model("gpt2")
    drift = {"model": [0.2, 0.4], "mask": [0.0, 0.0]}
    reproduced, fixed = quickstart.verdict(drift)
    kwargs = quickstart.metrics("tiny-gpt2", policy, drift, reproduced=reproduced, fixed=fixed)
    check_metrics(kwargs, "00_quickstart")
    assert kwargs["metrics"] == {"drift_without_position_ids": 0.4, "drift_with_position_ids": 0.0}
    assert kwargs["reproduced"] and kwargs["fixed"] and kwargs["not_shown"] is None
    assert "the fix removes it" in quickstart.conclusion_sentence("tiny-gpt2", policy, drift, reproduced=True)


def test_verdict_needs_a_drift_and_its_fix():
    assert quickstart.verdict({"model": [0.0, 0.4], "mask": [0.0, 0.0]}) == (True, True)
    assert quickstart.verdict({"model": [3e-7, 1e-7], "mask": [3e-7, 0.0]}) == (False, True)  # RoPE in fp32
    assert quickstart.verdict({"model": [0.4], "mask": [0.3]}) == (True, False)


def test_a_rotary_model_without_drift_says_why():
    rope, _ = tiny_model("qwen2")
    learned, _ = tiny_model("gpt2")
    quiet = {"model": [1e-6, 2e-6], "mask": [0.0, 0.0]}
    assert "rotary" in quickstart.not_shown(rope, quiet)
    reproduced, _ = quickstart.verdict(quiet)
    sentence = quickstart.conclusion_sentence("tiny-qwen2", rope, quiet, reproduced)
    assert "hides the bug" in sentence and quickstart.SHOWN_BY in sentence  # the same suggestion as not_shown's
    assert quickstart.SHOWN_BY in quickstart.not_shown(rope, quiet)
    assert quickstart.not_shown(rope, {"model": [0.5], "mask": [0.0]}) is None  # drift measured: shown
    assert quickstart.not_shown(learned, quiet) is None  # learned positions: a small drift is a result, not a blind spot


def test_figure_draws():
    ids, mask = pad_sequences([[5, 6], [7, 8, 9]], 0, side="left")
    assert drew(quickstart.figure_padding_and_positions(ids, mask))
