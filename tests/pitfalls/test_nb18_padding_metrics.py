"""nb18_padding_metrics: metrics(), the figures, the printed lines and the pad-columns explorer."""

import pytest
import torch
from pitfall_fakes import axes, check_metrics, drew

from workbench.experiments.checkpoints import load
from workbench.pitfalls import nb18_padding_metrics as pm
from workbench.tasks import rl_problems


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
        rows.append({"extra_pads": extra, "pad_fraction": float(1 - wide_mask.float().mean()), **pm.logged_statistics(*wide, wide_mask)})
    return rows


def test_metrics_returns_write_metrics_arguments():
    rows = synthetic_rows()
    kwargs = pm.metrics(rows, pm.drifts(rows))
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
    drifts = pm.drifts(rows)
    lines = pm.drift_lines(rows, drifts).splitlines()
    assert len(lines) == len(pm.MODES) and "drift over [0, 4, 16] extra pads" in lines[0]
    assert pm.headline_sentence(rows, drifts).endswith("pad-invariant up to float rounding.")


def test_figures_draw_on_their_axes():
    rows = synthetic_rows()
    fig = pm.figure_statistics_vs_padding(rows)
    assert len(fig.axes) == len(pm.STATISTICS) and drew(fig)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [label for _, _, label in pm.MODE_STYLES.values()]
    assert pm.caption_note(rows).startswith(f"The same sampled responses scored with {rows[0]['extra_pads']} to")
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


PROMPTS = [p.prompt for p in rl_problems(32)]


def test_p18_logged_statistics_by_hand():
    from workbench.pitfalls.nb18_padding_metrics import logged_statistics

    logp = torch.tensor([[-1.0, -2.0, -30.0], [-0.5, -30.0, -30.0]])  # −30: the log-prob of a pad token
    ref = torch.tensor([[-1.5, -2.0, -29.0], [-0.5, -28.0, -28.0]])
    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])  # stored as 0 where masked
    entropy = torch.tensor([[0.4, 0.2, 3.0], [0.6, 3.0, 3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    m = logged_statistics(logp, ref, old, entropy, mask)
    assert m["masked"]["entropy"] == pytest.approx(0.4) and m["masked"]["kl"] == pytest.approx(0.5 / 3)
    assert m["masked"]["ratio"] == pytest.approx(1.0) and m["masked"]["sequence_entropy"] == pytest.approx(1.75)
    assert m["sentinel"]["sequence_entropy"] == pytest.approx(0.25)  # rows: 1 + 2 − 1 and 0.5 − 1 − 1
    assert m["unmasked"]["entropy"] == pytest.approx(10.2 / 6) and m["unmasked"]["kl"] == pytest.approx((0.5 - 1 - 2 - 2) / 6)


def test_p18_unmasked_and_sentinel_statistics_move_with_the_pad_count(qwen):
    from workbench.pitfalls import nb18_padding_metrics as pm

    policy, tokenizer = qwen
    reference, _ = load("tiny-arith-gpt2")
    rows = pm.pad_invariance(policy, reference, tokenizer, PROMPTS[:16], [0, 8])
    assert rows[0]["sentinel"]["sequence_entropy"] - rows[1]["sentinel"]["sequence_entropy"] == pytest.approx(8.0, abs=1e-4)
    assert pm.drift(rows, "unmasked", "ratio") > 0.1 and pm.drift(rows, "unmasked", "kl") > 0.1
    assert all(pm.drift(rows, "masked", k) < 1e-5 for k in ("entropy", "kl", "ratio", "sequence_entropy"))
    assert pm.verdict(pm.drifts(rows)) == (True, True)


def test_p18_verdict_says_false_on_bug_absent_numbers():
    from workbench.pitfalls.nb18_padding_metrics import drifts, verdict

    values = {"entropy": 0.6, "kl": 0.5, "ratio": 1.0, "sequence_entropy": 2.0}
    same = [{"extra_pads": w, **{mode: dict(values) for mode in ("unmasked", "sentinel", "masked")}} for w in (0, 8)]
    assert verdict(drifts(same)) == (False, True)
    moved = [same[0], {**same[1], "masked": {**values, "kl": 0.6}}]
    assert verdict(drifts(moved)) == (False, False)
