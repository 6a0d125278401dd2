"""Notebook 23's pitfall module: the figures, the explorer and the metrics the notebook writes."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.pitfalls import nb23_bf16_updates as p23  # noqa: E402

LRS = [1e-6, 1e-3]
SWEEP = {"bf16": [0.9, 0.1], "bf16-mixed": [0.0, 0.0], "bf16 moved and came back": [0.05, 0.01], "predicted (lr < ulp/2)": [0.8, 0.05]}


def fake_run(losses: list[float], frozen: float) -> dict:
    return {"losses": losses, "steps": len(losses), "frozen_fraction": frozen,
            "frozen_fraction_by_kind": {"matrices": frozen, "gains and biases": frozen}}


RUNS = {"fp32": fake_run([2.0, 1.5, 1.0], 0.0), "bf16-mixed": fake_run([2.0, 1.5, 1.1], 0.0), "bf16": fake_run([2.0, 1.9, 1.9], 0.9)}


def test_rounding_threshold_explorer_redraws_with_the_learning_rate():
    model = torch.nn.Linear(64, 64)
    torch.nn.init.normal_(model.weight, std=0.02)
    explorer = p23.rounding_threshold_explorer(model)
    small = explorer.last["predicted_lost_fraction"]
    explorer.controls["lr"].value = 1e-2
    assert explorer.renders == 2 and explorer.last["predicted_lost_fraction"] < small


def test_figures_draw_on_a_given_ax():
    fig, axes = plt.subplots(1, 3)
    p23.plot_frozen_vs_lr(axes[0], LRS, SWEEP, 5)
    assert len(axes[0].lines) == len(SWEEP) and axes[0].get_xscale() == "log"
    p23.plot_loss_curves(axes[1], RUNS, lr=1e-5, seed=0)
    assert [line.get_label().split(":")[0] for line in axes[1].lines] == ["fp32", "bf16-mixed", "bf16"]
    lost = p23.plot_rounding_threshold(axes[2], torch.tensor([1.0, 0.02, -0.5]), 1e-4)
    assert lost == pytest.approx(2 / 3)  # 1e-4 moves 0.02 (ulp/2 = 6e-5) but not 1.0 or 0.5
    plt.close(fig)
    for fig in (p23.figure_frozen_vs_lr(LRS, SWEEP, 5), p23.figure_loss_curves(RUNS, lr=1e-5, seed=0)):
        assert len(fig.axes) == 1 and fig.axes[0].has_data()
        plt.close(fig)


def test_metrics_are_write_metrics_arguments(tmp_path):
    drop = p23.loss_drop(RUNS)
    assert drop["fp32"] == pytest.approx(1.0) and drop["bf16"] == pytest.approx(0.1)
    written = written_metrics(p23.metrics(LRS, SWEEP, RUNS, drop, curve_steps=3, headline_lr=1e-5), tmp_path)
    assert (written["reproduced"], written["fixed"]) == (True, True)
    assert written["metrics"]["frozen_fraction_sweep"] == SWEEP and written["headline"]["bug"] == 0.9
    assert "pure bf16 gets 10% of the fp32 drop" in p23.drop_lines(drop, 3)
    assert p23.sweep_lines(LRS, SWEEP).splitlines()[-1].startswith("largest excess over the prediction: lr 1e-06, 10.0%")
    assert "kept in bf16: False, kept in fp32: True" in p23.rounding_lines()
