"""nb00_quickstart (notebook 00): metrics() and the printed conclusion on nb01's verdict, the figure."""

from pitfall_fakes import check_metrics, drew

from workbench.core.batching import pad_sequences
from workbench.modeling.tiny import tiny_model
from workbench.pitfalls import nb00_quickstart as quickstart
from workbench.pitfalls import nb01_position_ids as position_ids


def test_metrics_and_conclusion():
    policy, _ = tiny_model("gpt2")
    drift = {"model": [0.2, 0.4], "mask": [0.0, 0.0]}
    reproduced, fixed = position_ids.verdict(max(drift["model"]), max(drift["mask"]))
    why = position_ids.not_shown(policy, max(drift["model"]))
    kwargs = quickstart.metrics("tiny-gpt2", drift, reproduced=reproduced, fixed=fixed, not_shown=why)
    check_metrics(kwargs, "00_quickstart")
    assert kwargs["metrics"] == {"drift_without_position_ids": 0.4, "drift_with_position_ids": 0.0}
    assert kwargs["reproduced"] and kwargs["fixed"] and kwargs["not_shown"] is None
    sentence = quickstart.conclusion_sentence("tiny-gpt2", policy, drift, reproduced, why, fixed=fixed)
    assert "with the fix the drift is 0 up to float rounding" in sentence
    rounding = {"model": [0.2, 0.4], "mask": [4.8e-7, 0.0]}  # fp32 rounding: what the fix leaves, not 0
    assert "0 up to float rounding" in quickstart.conclusion_sentence("tiny-gpt2", policy, rounding, True, None, fixed=True)
    assert "leaves a drift above float rounding" in quickstart.conclusion_sentence("tiny-gpt2", policy, drift, True, None,
                                                                                   fixed=False)


def test_a_rotary_model_without_drift_says_why():
    rope, _ = tiny_model("qwen2")
    quiet = {"model": [1e-6, 2e-6], "mask": [0.0, 0.0]}
    reproduced, fixed = position_ids.verdict(max(quiet["model"]), max(quiet["mask"]))
    why = position_ids.not_shown(rope, max(quiet["model"]))
    assert (reproduced, fixed) == (False, True) and "rotary" in why
    sentence = quickstart.conclusion_sentence("tiny-qwen2", rope, quiet, reproduced, why, fixed=fixed)
    assert "no drift above float noise" in sentence and why in sentence  # the same reason as metrics' not_shown
    assert quickstart.metrics("tiny-qwen2", quiet, reproduced=reproduced, fixed=fixed, not_shown=why)["not_shown"] == why


def test_figure_draws():
    ids, mask = pad_sequences([[5, 6], [7, 8, 9]], 0, side="left")
    assert drew(quickstart.figure_padding_and_positions(ids, mask))
    assert "cumsum(mask) − 1" in quickstart.padding_note()
