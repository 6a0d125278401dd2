"""nb19_batch_shape_logprobs: metrics(), the figures, the printed lines, the long-prompt guard and the layout explorer."""

import pytest
import torch
from pitfall_fakes import axes, check_metrics, drew

from workbench.pitfalls import nb19_batch_shape_logprobs as p19

SIZES = [1, 4, 8]


def case(deviation: float) -> dict:
    log_ratio = torch.tensor([deviation, -deviation / 2, 0.0])
    return {"log_ratio": log_ratio, "tokens": 3, "max_ratio_deviation": float((log_ratio.exp() - 1).abs().max()),
            "mean_abs_log_ratio": float(log_ratio.abs().mean()), "fraction_ratio_not_one": float((log_ratio != 0).float().mean()),
            "clip_fraction": float(((log_ratio.exp() - 1).abs() > 0.2).float().mean())}


def ratios(bug: float = 0.3) -> dict:
    return {"π_old over the batch (bug)": case(bug), "π_old in the training layout": case(0.0), "fixed width for every batch": case(0.0)}


SWEEPS = {name: [{k: v for k, v in case(d).items() if k != "log_ratio"} | {"micro_batch_size": s} for s, d in zip(SIZES, ds, strict=True)]
          for name, ds in (("fp32", (1e-7, 2e-7, 0.0)), ("bf16", (1e-2, 3e-2, 2e-2)))}
DRIFT = {"fp32": [0.0, 1e-7, 2e-7], "bf16": [0.0, 1e-2, 4e-2]}


def test_metrics_returns_write_metrics_arguments():
    kwargs = p19.metrics(drift=DRIFT, sweeps=SWEEPS, ratios=ratios(), train_micro_batch=8, not_shown=["no long prompts"])
    check_metrics(kwargs, "19_batch_shape_logprobs")
    assert (kwargs["reproduced"], kwargs["fixed"]) == (True, True) and kwargs["not_shown"] == ["no long prompts"]
    assert kwargs["metrics"]["width_drift_max"] == {"fp32": 2e-7, "bf16": 4e-2}
    assert all("log_ratio" not in r for r in kwargs["metrics"]["ratio_at_lr0"].values())  # tensors stay out of metrics.json
    assert kwargs["headline"]["bug"] == pytest.approx(0.3499, abs=1e-3) and kwargs["headline"]["fix"] == 0.0
    assert "micro-batch 8" in kwargs["headline"]["what"]


def test_metrics_say_why_when_the_layout_does_not_move_the_log_probs():
    kwargs = p19.metrics(drift=DRIFT, sweeps=SWEEPS, ratios=ratios(bug=0.0), train_micro_batch=8, not_shown=[])
    assert not kwargs["reproduced"] and len(kwargs["not_shown"]) == 1 and "barely move" in kwargs["not_shown"][0]


def test_figures_and_lines():
    assert drew(p19.figure_width_drift([10, 11, 12], DRIFT))
    assert drew(p19.figure_micro_batch_sweep(SIZES, SWEEPS))
    fig, ax = axes()
    p19.plot_log_ratio(ax, "π_old over the batch (bug)", case(0.3))
    assert drew(fig)
    assert p19.width_drift_line(DRIFT) == "max drift over widths: bf16 4.00e-02, fp32 2.00e-07 nats"
    assert p19.sweep_note(SWEEPS, SIZES, 8).startswith("micro-batch 8: ")
    assert p19.sweep_note(SWEEPS, SIZES, 3).startswith("micro-batch 8: ")  # not swept: the largest size
    assert len(p19.ratio_lines(ratios()).splitlines()) == 4  # three cases and the clip note


def test_long_prompts_only_where_the_position_table_reaches_past_the_key_block():
    from workbench.experiments.checkpoints import load

    gpt2, _ = load("tiny-arith-gpt2")  # learned positions, 256 of them
    long_prompts, not_shown = p19.usable_long_prompts(gpt2, 2)
    assert long_prompts == 0 and "position table ends at 256 tokens" in not_shown[0]
    assert p19.usable_long_prompts(gpt2, 0) == (0, [])
    qwen2, _ = load("tiny-arith-qwen2")  # rotary: no table to run off
    assert p19.usable_long_prompts(qwen2, 2) == (2, [])


def test_layout_log_ratio_explorer_switches_the_case():
    explorer = p19.layout_log_ratio_explorer(ratios())
    assert explorer.renders == 1 and explorer.last["max_ratio_deviation"] > 0.3
    explorer.controls["case"].value = "fixed width for every batch"
    assert explorer.renders == 2 and explorer.last["max_ratio_deviation"] == 0.0 and "log_ratio" not in explorer.last
