"""nb18_padding_metrics: metrics(), the figures, the printed lines and the pad-columns explorer."""

import pytest
import torch
from pitfall_fakes import axes, check_metrics, drew

from workbench.pitfalls import nb18_padding_metrics as pm


def synthetic_rows(extra_pads=(0, 4, 16)) -> list[dict]:
    """``pad_invariance``-shaped rows from fixed random log-probs: the same 3 × 5 batch with more pad columns."""
    g = torch.Generator().manual_seed(0)
    logp, ref, old = (-torch.rand(3, 5, generator=g) * 3 for _ in range(3))
    entropy = torch.rand(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    rows = []
    for extra in extra_pads:
        wide = [torch.cat([t, torch.full((3, extra), -0.5)], 1) for t in (logp, ref, old, entropy)]
        wide_mask = torch.cat([mask, torch.zeros(3, extra, dtype=torch.long)], 1)
        rows.append({"extra_pads": extra, "pad_fraction": float(1 - wide_mask.float().mean()), **pm.logged_metrics(*wide, wide_mask)})
    return rows


def test_metrics_returns_write_metrics_arguments():
    rows = synthetic_rows()
    kwargs = pm.metrics(rows)
    check_metrics(kwargs, "18_padding_metrics")
    assert (kwargs["reproduced"], kwargs["fixed"]) == (True, True)  # the grid means move with the pads, the masked ones do not
    assert set(kwargs["metrics"]["drift"]) == set(pm.MODES) and kwargs["metrics"]["rows"] is rows
    assert set(kwargs["metrics"]["drift"]["masked"]) == {"entropy", "kl", "ratio", "sequence_entropy"}
    assert kwargs["headline"]["fix"] == pytest.approx(rows[0]["masked"]["sequence_entropy"], rel=1e-6)
    pads_per_row = (2 + 4) / 3 + 16  # the batch's own pads, then 16 pad columns: each adds −INVALID_LOGPROB to Σ_t −log π
    assert kwargs["headline"]["bug"] == pytest.approx(kwargs["headline"]["fix"] - pm.INVALID_LOGPROB * pads_per_row, rel=1e-5)
    assert "16 extra pad columns" in kwargs["headline"]["what"]


def test_printed_lines():
    rows = synthetic_rows()
    lines = pm.drift_lines(rows).splitlines()
    assert len(lines) == len(pm.MODES) and "drift over [0, 4, 16] extra pads" in lines[0]
    assert pm.headline_sentence(rows).endswith("the masked statistics are pad-invariant.")


def test_figures_draw_on_their_axes():
    rows = synthetic_rows()
    fig = pm.figure_padding_metrics(rows)
    assert len(fig.axes) == len(pm.STATISTICS) and drew(fig)
    fig, ax = axes()
    pm.plot_pad_shift(ax, rows)
    assert len(ax.patches) == len(pm.MODES) * len(pm.STATISTICS)
    assert drew(fig)


def test_pad_columns_explorer_rescores_with_the_chosen_width():
    from workbench.experiments.checkpoints import load

    policy, tokenizer = load("tiny-arith-qwen2")
    explorer = pm.pad_columns_explorer(policy, policy, tokenizer, ["1+2=", "12+34=", "5*5="], width=8)
    assert explorer.renders == 1 and explorer.last["extra_pads"] == 8
    masked = explorer.last["masked"]["sequence_entropy"]
    explorer.controls["width"].value = 32
    assert explorer.renders == 2 and explorer.last["extra_pads"] == 32
    assert explorer.last["masked"]["sequence_entropy"] == pytest.approx(masked, abs=1e-4)
    assert explorer.last["pad_fraction"] > 0.5
