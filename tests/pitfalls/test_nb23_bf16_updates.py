"""Notebook 23's pitfall module: the figures, the explorer and the metrics the notebook writes."""

import matplotlib

matplotlib.use("Agg")

import copy  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.pitfalls import nb23_bf16_updates as bf16_updates  # noqa: E402
from workbench.pitfalls import nb23_bf16_updates as p23  # noqa: E402
from workbench.viz import legibility  # noqa: E402

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
    assert [line.get_label().split(":")[0] for line in axes[1].lines] == ["fp32", "bf16-mixed (fix)", "bf16 (bug)"]
    weights = torch.tensor([1.0, 0.02, -0.5])
    lost = p23.predicted_lost_fraction(weights, 1e-4)
    assert lost == pytest.approx(2 / 3)  # 1e-4 moves 0.02 (ulp/2 = 6e-5) but not 1.0 or 0.5
    p23.plot_rounding_threshold(axes[2], weights, 1e-4, lost)
    assert axes[2].has_data() and f"({lost:.1%})" in axes[2].get_legend().get_texts()[0].get_text()
    plt.close(fig)
    for fig in (p23.figure_frozen_vs_lr(LRS, SWEEP, 5), p23.figure_loss_curves(RUNS, lr=1e-5, seed=0)):
        assert len(fig.axes) == 1 and fig.axes[0].has_data()
        assert legibility.check_figure(fig).problems() == []
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


def test_p23_bf16_spacing_by_hand():
    assert float(bf16_updates.bf16_ulp(1.0)) == 2**-7
    assert float(bf16_updates.bf16_ulp(1.5)) == 2**-7 and float(bf16_updates.bf16_ulp(2.0)) == 2**-6
    assert float(bf16_updates.bf16_ulp(0.02)) == 2**-13  # 0.02 lies in [2^-6, 2^-5)
    assert not bf16_updates.update_survives(1.0, 1e-4)  # 1e-4 < 2^-8: rounded away in bf16
    assert bf16_updates.update_survives(1.0, 1e-4, torch.float32)  # kept in fp32
    assert not bf16_updates.update_survives(1.0, 2**-8)  # exactly half an ulp: ties to even (1.0)
    assert bf16_updates.update_survives(1.0, 2**-8 + 2**-12)
    # prediction: |w| = 1 freezes, |w| = 1e-3 (ulp 2^-17 ≈ 7.6e-6) moves with a step of 1e-4
    assert bf16_updates.predicted_lost_fraction(torch.tensor([1.0, -1.0, 1e-3, 2e-3]), 1e-4) == 0.5


def test_p23_pure_bf16_freezes_weights_and_fp32_masters_do_not(qwen):
    model, tokenizer = qwen
    batch = bf16_updates.sft_batch_for(tokenizer, n=16)
    bug = bf16_updates.adam_steps(copy.deepcopy(model), batch, precision="bf16", lr=1e-5, steps=2)
    fix = bf16_updates.adam_steps(copy.deepcopy(model), batch, precision="bf16-mixed", lr=1e-5, steps=2)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert bug["frozen_fraction"] > 0.8 and fix["frozen_fraction"] < 1e-3
    assert bug["frozen_fraction_by_kind"]["gains and biases"] > 0.9  # norm gains ≈ 1 never move
    assert abs(bug["frozen_fraction"] - bf16_updates.predicted_lost_fraction(weights, 1e-5)) < 0.05
    assert bf16_updates.verdict(bug["frozen_fraction"], fix["frozen_fraction"]) == (True, True)


def test_p23_verdict_false_on_bug_absent_numbers():
    assert bf16_updates.verdict(0.0, 0.0) == (False, True)  # nothing frozen: no bug to see
    assert bf16_updates.verdict(0.9, 0.4) == (True, False)  # masters that still freeze: not fixed


def test_p23_bad_precision_is_a_clear_error(qwen):
    model, tokenizer = qwen
    with pytest.raises(ValueError, match="bf16-mixed"):
        batch = bf16_updates.sft_batch_for(tokenizer, n=4)
        bf16_updates.adam_steps(copy.deepcopy(model), batch, precision="fp8", lr=1e-5, steps=1)
