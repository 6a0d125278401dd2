"""Pitfall P18: logged metrics averaged over padding, or with a sentinel log-prob.

A batch of responses is a (B, R) grid: real tokens, then pads after each row's EOS. The scorer returns
a value at every cell, pads included (the log-prob of a pad token, the entropy of the distribution
at a pad position), and some trainers keep a sentinel there. A statistic taken over the whole grid
mixes these cells in, so the logged number depends on how many pad columns the batch happened to get:

* plain means over the grid: mean entropy, mean KL, mean ratio (the trainer's own loss may be masked
  correctly — TRL #6803/#6809 list Online DPO and PPO statistics that were not);
* a sentinel: TRL's PPO filled pad log-probs with INVALID_LOGPROB = 1.0 and logged the entropy as
  Σ_t −log π(a_t) per sequence, so each pad added −1 and the "entropy" went negative (TRL #2022,
  #2281; fixed in PR #6121 by multiplying by the mask).

The fix: every statistic is Σ(value · mask) / Σ mask (per token) or Σ_t value · mask per sequence, and
a pad-invariance test: adding pad columns to a batch must not move any logged number (TRL PR #6654).
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core.losses import masked_mean
from workbench.modeling.rollout import Rollout, sample
from workbench.modeling.scoring import response_logprobs
from workbench.tasks import encode_prompts
from workbench.viz import plots
from workbench.viz.explorer import Explorer
from workbench.viz.plots import note_coinciding

INVALID_LOGPROB = 1.0  # TRL PPO's sentinel for pad positions
MODES = ("unmasked", "sentinel", "masked")
STATISTICS = {"entropy": "entropy per token (nats)", "kl": "KL k1 per token", "ratio": "mean ratio π/π_old",
              "sequence_entropy": "Σ_t −log π per sequence"}  # what each logged statistic is, as the figure labels it


# ---- measurements -------------------------------------------------------------------------------
def rollout_for(model, tokenizer, prompts: list[str], seed: int = 0, max_new_tokens: int = 6) -> Rollout:
    ids, mask = encode_prompts(tokenizer, prompts)
    return sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed))


def widen(rollout: Rollout, extra: int, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rollout's responses with ``extra`` more pad columns: ``(response_ids, response_mask, old_logprobs)``."""
    b = rollout.response_ids.shape[0]
    ids = torch.cat([rollout.response_ids, torch.full((b, extra), pad_token_id, dtype=torch.long)], 1)
    mask = torch.cat([rollout.response_mask, torch.zeros((b, extra), dtype=torch.long)], 1)
    old = torch.cat([rollout.rollout_logprobs, torch.zeros((b, extra))], 1)  # stored as 0 where masked
    return ids, mask, old


def logged_statistics(logprobs, ref_logprobs, old_logprobs, entropy, mask) -> dict:
    """The same four statistics three ways: ``unmasked`` (plain means over the grid), ``sentinel``
    (pad log-probs set to INVALID_LOGPROB, then plain means / per-sequence sums), ``masked`` (fix).

    ``entropy``: mean per-token entropy of the policy; ``kl``: mean k1 = log π − log π_ref;
    ``ratio``: mean π/π_old; ``sequence_entropy``: mean over rows of Σ_t −log π(a_t) (TRL PPO's estimate).
    """
    mask = mask.float()
    pad = ~mask.bool()
    out = {"unmasked": {"entropy": entropy.mean(), "kl": (logprobs - ref_logprobs).mean(),
                        "ratio": (logprobs - old_logprobs).exp().mean(), "sequence_entropy": (-logprobs).sum(1).mean()}}
    lp, ref = logprobs.masked_fill(pad, INVALID_LOGPROB), ref_logprobs.masked_fill(pad, INVALID_LOGPROB)
    old = old_logprobs.masked_fill(pad, INVALID_LOGPROB)
    out["sentinel"] = {"entropy": entropy.masked_fill(pad, 0).mean(), "kl": (lp - ref).mean(),
                       "ratio": (lp - old).exp().mean(), "sequence_entropy": (-lp).sum(1).mean()}
    out["masked"] = {"entropy": masked_mean(entropy, mask), "kl": masked_mean(logprobs - ref_logprobs, mask),
                     "ratio": masked_mean((logprobs - old_logprobs).exp(), mask),
                     "sequence_entropy": (-logprobs * mask).sum(1).mean()}
    return {mode: {k: float(v) for k, v in values.items()} for mode, values in out.items()}


# ---- sweeps -------------------------------------------------------------------------------------
@torch.no_grad()
def pad_invariance(policy, reference, tokenizer, prompts: list[str], extra_pads: list[int], seed: int = 0) -> list[dict]:
    """Sample once, then score the same responses with 0, w₁, w₂, … extra pad columns; one row of
    ``logged_statistics`` per width (``{"extra_pads", "pad_fraction", "unmasked", "sentinel", "masked"}``)."""
    rollout = rollout_for(policy, tokenizer, prompts, seed=seed)
    rows = []
    for extra in extra_pads:
        ids, mask, old = widen(rollout, extra, tokenizer.pad_token_id)
        logp, entropy = response_logprobs(policy, rollout.prompt_ids, rollout.prompt_mask, ids, mask, with_entropy=True)
        ref = response_logprobs(reference, rollout.prompt_ids, rollout.prompt_mask, ids, mask)
        rows.append({"extra_pads": extra, "pad_fraction": float(1 - mask.float().mean()),
                     **logged_statistics(logp.float(), ref.float(), old, entropy.float(), mask)})
    return rows


def drift(rows: list[dict], mode: str, key: str) -> float:
    """max over widths of |metric(width) − metric(first width)|: 0 for a pad-invariant statistic."""
    return max(abs(r[mode][key] - rows[0][mode][key]) for r in rows)


def drifts(rows: list[dict]) -> dict:
    """``{mode: {statistic: drift}}`` of every mode and statistic over the pad widths of ``rows``."""
    return {mode: {key: drift(rows, mode, key) for key in STATISTICS} for mode in MODES}


# ---- verdict ------------------------------------------------------------------------------------
def verdict(drift_by_mode: dict, tolerance: float = 1e-4) -> tuple[bool, bool]:
    """(reproduced, fixed) from ``drifts``: some unmasked or sentinel statistic moves with the pad count by more than
    100 × ``tolerance``; every masked statistic stays within ``tolerance``."""
    keys = ("entropy", "kl", "ratio", "sequence_entropy")
    reproduced = any(drift_by_mode[mode][k] > 100 * tolerance for mode in ("unmasked", "sentinel") for k in keys)
    return reproduced, all(drift_by_mode["masked"][k] < tolerance for k in keys)


# ---- figures ------------------------------------------------------------------------------------
MODE_STYLES = {"unmasked": (plots.BUG_COLOR, "o-", "unmasked (bug)"),
               "sentinel": (plots.NEUTRAL_COLOR, "^--", f"pads = {INVALID_LOGPROB} (bug)"),
               "masked": (plots.FIX_COLOR, "s-", "masked (fix)")}  # the sentinel: a second bug, in the neutral colour


def plot_metric(ax, rows: list[dict], key: str, ylabel: str) -> None:
    """One statistic against the pad columns added, per mode; a point hidden under another series is ringed (the
    legend's labels stay short: ``caption_note`` says what a ring means)."""
    x = [r["extra_pads"] for r in rows]
    for mode, (color, style, label) in MODE_STYLES.items():
        ax.plot(x, [r[mode][key] for r in rows], style, color=color, label=label, ms=4)
    ax.set_xlabel("extra pad columns")
    ax.set_ylabel(ylabel)
    plots.integer_axis(ax.xaxis)
    note_coinciding(ax, ring_only=True)
    if ax.get_legend():
        ax.get_legend().remove()  # one legend for the figure


def figure_statistics_vs_padding(rows: list[dict]):
    """The notebook's figure: each statistic of ``STATISTICS`` against the pad columns added (one ``plot_metric`` each),
    2 × 2, one legend under the grid."""
    fig, axes = plots.panel_grid(len(STATISTICS), panel_height=3.0)
    for ax, (key, label) in zip(axes, STATISTICS.items(), strict=True):
        plot_metric(ax, rows, key, label)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))  # the bottom strip holds the legend
    return fig


def plot_pad_shift(ax, rows: list[dict]) -> None:
    """|Δ| of each statistic between the first and the last row's pad width, per mode (grouped bars, symlog)."""
    colors = {mode: color for mode, (color, _, _) in MODE_STYLES.items()}
    first, last = rows[0], rows[-1]
    width = 0.8 / len(MODES)
    for i, mode in enumerate(MODES):
        x = [k + (i - 1) * width for k in range(len(STATISTICS))]
        ax.bar(x, [abs(last[mode][key] - first[mode][key]) for key in STATISTICS], width, color=colors[mode],
               label=MODE_STYLES[mode][2])
    ax.set_xticks(range(len(STATISTICS)), list(STATISTICS), fontsize=8)
    ax.set_yscale("symlog", linthresh=1e-6)
    ax.set_ylabel(f"|change|, {first['extra_pads']} → {last['extra_pads']} pads")
    plots.legend_outside(ax, "right")


# ---- printers -----------------------------------------------------------------------------------
def caption_note(rows: list[dict]) -> str:
    """The caption under the figure: what the three modes are and what a ring means."""
    return (f"The same sampled responses scored with {rows[0]['extra_pads']} to {rows[-1]['extra_pads']} extra pad columns "
            "appended; each panel is one logged statistic. Unmasked: the mean over every cell of the grid, pads included "
            f"(bug); pads = {INVALID_LOGPROB}: pad log-probs filled with the sentinel {INVALID_LOGPROB} then averaged (bug); "
            "masked: Σ v·m / Σ m over the response tokens (fix). A ring marks a point hidden under another series.")


def drift_lines(rows: list[dict], drift_by_mode: dict) -> str:
    """Per mode, each statistic's drift (``drifts``) over the pad widths of ``rows``."""
    widths = [r["extra_pads"] for r in rows]
    return "\n".join(f"{mode:>8}: drift over {widths} extra pads — " + ", ".join(f"{k} {drift_by_mode[mode][k]:.2e}" for k in STATISTICS)
                     for mode in MODES)


def headline_sentence(rows: list[dict], drift_by_mode: dict) -> str:
    last = rows[-1]
    return (f"With {last['extra_pads']} extra pad columns ({last['pad_fraction']:.0%} of the grid is padding): Σ −log π per sequence "
            f"logs {last['sentinel']['sequence_entropy']:.3f} with the sentinel and {last['unmasked']['sequence_entropy']:.3f} unmasked, "
            f"{last['masked']['sequence_entropy']:.3f} masked; "
            + (f"the masked statistics move by at most {max(drift_by_mode['masked'].values()):.1e}: pad-invariant up to float "
               "rounding." if verdict(drift_by_mode)[1] else "the masked ones move too."))


# ---- explorer -----------------------------------------------------------------------------------
def pad_columns_explorer(policy, reference, tokenizer, prompts: list[str], *, seed: int = 0, width: int = 8) -> Explorer:
    """P18: how far each logged statistic moves when ``width`` pad columns are added to the same batch."""

    def draw(width):
        rows = pad_invariance(policy, reference, tokenizer, prompts, [0, width], seed=seed)
        fig, ax = plt.subplots(figsize=(8, 3.2))
        plot_pad_shift(ax, rows)
        return rows[-1]

    slider = widgets.IntSlider(value=width, min=0, max=64, description="extra pads")
    return Explorer({"width": slider}, draw, "P18: logged statistics with more pad columns")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(rows: list[dict], drift_by_mode: dict) -> dict:
    """Notebook 18's ``notebook_api.write_metrics`` keyword arguments (``drift_by_mode``: ``drifts(rows)``)."""
    reproduced, fixed = verdict(drift_by_mode)
    last = rows[-1]
    return {
        "notebook": "18_padding_metrics", "reproduced": reproduced, "fixed": fixed,
        "metrics": {"drift": drift_by_mode, "rows": rows},
        "headline": {"what": f"logged entropy Σ_t −log π per sequence with {last['extra_pads']} extra pad columns (sentinel vs masked)",
                     "unit": "nats/sequence", "bug": last["sentinel"]["sequence_entropy"], "fix": last["masked"]["sequence_entropy"]},
    }
