"""Pitfall P13: whitening advantages or rewards over padded positions.

``(x − x.mean()) / x.std()`` over a padded (B, T) tensor counts every pad as a real value: the
mean and std move with the amount of padding, so the real tokens' whitened values are neither
centred nor unit-scaled, and shorter batches are whitened differently from longer ones.
``workbench.core.losses.masked_whiten`` uses real tokens only.
"""

from __future__ import annotations

import dataclasses

import ipywidgets as widgets
import torch

from workbench.core import losses
from workbench.core.losses import masked_mean, masked_var, masked_whiten, naive_whiten
from workbench.experiments import statistics
from workbench.experiments.checkpoints import load
from workbench.tasks import rl_problems, task_info
from workbench.trainers.ppo import PPOConfig, PPOTrainer, last_token_rewards
from workbench.viz import plots
from workbench.viz.explorer import Explorer

PPO_VARIANTS = {"whiten_over=padded (bug)": {"whiten_over": "padded"}, "whiten_over=real (fix)": {"whiten_over": "real"}}


# ---- measurements -------------------------------------------------------------------------------
def real_token_stats(whitened: torch.Tensor, mask: torch.Tensor) -> dict:
    """Mean and std of the whitened values over real tokens (should be 0 and 1)."""
    return {"mean": float(masked_mean(whitened, mask)), "std": float(masked_var(whitened, mask).sqrt())}


def rollout_advantages(model_name: str, *, task: str = "arith", seed: int = 0, gamma: float = 1.0, lam: float = 0.95,
                       device: str = "auto", pad_token: str | None = "auto"):
    """GAE advantages of one PPO rollout of ``model_name`` on 64 prompts of ``task`` (its ``max_new_tokens``;
    sparse score on the last token, V = 0): ``(advantages, mask)``, both (B, T) with real padding."""
    policy, tokenizer = load(model_name, device=device, pad_token=pad_token)
    config = PPOConfig(steps=1, seed=seed, progress=False, max_new_tokens=task_info(task).max_new_tokens)
    trainer = PPOTrainer(policy, tokenizer, rl_problems(64, task), config)
    _, rollout, scores = trainer.rollout(0)
    mask = rollout.response_mask.float()
    advantages, _ = losses.gae(last_token_rewards(scores, mask), torch.zeros_like(mask), mask, gamma, lam)
    return advantages, mask


# ---- sweeps -------------------------------------------------------------------------------------
def whitening_vs_padding(values: torch.Tensor, mask: torch.Tensor, extra_pads: list[int]) -> list[dict]:
    """Real-token statistics after naive and masked whitening as padding columns are added."""
    rows = []
    for extra in extra_pads:
        padded_values = torch.cat([values, values.new_zeros(values.shape[0], extra)], 1)
        padded_mask = torch.cat([mask, mask.new_zeros(mask.shape[0], extra)], 1)
        naive = real_token_stats(naive_whiten(padded_values) * padded_mask, padded_mask)
        masked = real_token_stats(masked_whiten(padded_values, padded_mask), padded_mask)
        rows.append({"extra_pads": extra, "padding_fraction": 1 - float(padded_mask.float().mean()),
                     "naive_mean": naive["mean"], "naive_std": naive["std"], "masked_mean": masked["mean"], "masked_std": masked["std"]})
    return rows


def smoothing_window(ppo_steps: int) -> int:
    """The moving-average window of the training figure's bands: a tenth of the run, at least 1 step."""
    return max(1, ppo_steps // 10)


EFFECT_KEYS = ("advantage_mean_real_tokens", "reward", "heldout_accuracy")


def with_absolute_advantage_mean(runs: dict) -> dict:
    """The runs with ``advantage_abs_mean_real_tokens`` = |advantage_mean_real_tokens| added to every record."""
    return {label: [[{**record, "advantage_abs_mean_real_tokens": abs(record["advantage_mean_real_tokens"])} for record in history]
                    for history in histories] for label, histories in runs.items()}


def ppo_effects(runs: dict) -> dict:
    """The bug-vs-fix effect (with its seed noise) on each of ``EFFECT_KEYS`` and on the predicted measure."""
    effects = {key: statistics.effect(runs, key, *PPO_VARIANTS) for key in EFFECT_KEYS}
    effects[PREDICTION.measure] = statistics.effect(with_absolute_advantage_mean(runs), PREDICTION.measure, *PPO_VARIANTS)
    return effects


# ---- verdict ------------------------------------------------------------------------------------
# Stated before any run: whitening over padded positions leaves the real tokens' advantages off centre
# by mean_real × (padded share) / std — of either sign, so the prediction is on its size. Responses of varied length
# (the sums task) give the padding room.
PREDICTION = statistics.Prediction("advantage_abs_mean_real_tokens", "|mean whitened advantage over real tokens|", "+")


def verdict(rows: list[dict], *, threshold: float = 0.05, tolerance: float = 1e-5) -> tuple[bool, bool]:
    """(reproduced, fixed): naive whitening leaves real-token advantages off-centre by more than
    ``threshold`` at some padding; masked whitening gives mean 0 (≤ ``tolerance``) and std 1 (±1e-3) at every padding."""
    reproduced = max(abs(r["naive_mean"]) for r in rows) > threshold
    fixed = all(abs(r["masked_mean"]) <= tolerance and abs(r["masked_std"] - 1) < 1e-3 for r in rows)
    return bool(reproduced), bool(fixed)


def not_shown(rows: list[dict]) -> str | None:
    """Why this checkpoint cannot show the pitfall, or None: when every advantage of the rollout is 0
    (all rewards equal: an untrained checkpoint answers nothing right), whitening has nothing to centre."""
    if any(r["naive_std"] > 0 or r["masked_std"] > 0 for r in rows):
        return None
    return ("every advantage of this checkpoint's rollout is 0 (all rewards equal: an untrained checkpoint answers nothing "
            "right), so whitening has nothing to centre or scale; use a trained one")


# ---- figures ------------------------------------------------------------------------------------
def plot_whitening(axes, rows: list[dict]) -> None:
    """Mean and std of whitened advantages on real tokens vs the padding share, naive (bug) and masked (fix), each
    against its target (grey: mean 0, std 1); one legend, below the first panel."""
    fractions = [r["padding_fraction"] * 100 for r in rows]
    for ax, key, ylabel, target in ((axes[0], "mean", "mean on real tokens", 0.0), (axes[1], "std", "std on real tokens", 1.0)):
        ax.plot(fractions, [r[f"naive_{key}"] for r in rows], "o-", color=plots.BUG_COLOR, label="over every position (bug)")
        ax.plot(fractions, [r[f"masked_{key}"] for r in rows], "s--", color=plots.FIX_COLOR, label="over real tokens (fix)")
        ax.axhline(target, color=plots.NEUTRAL_COLOR, lw=0.8)
        ax.set_xlabel("padding in the batch (%)")
        ax.set_ylabel(ylabel)
    plots.legend_outside(axes[0], "below")


def figure_whitening_vs_padding(rows: list[dict]):
    """Part 1's figure: ``plot_whitening`` on two panels side by side (caption: ``whitening_note``)."""
    return plots.figure_row(lambda axes: plot_whitening(axes, rows), 2, (plots.NOTEBOOK_WIDTH, 3.2))


TRAINING_PANELS = (("advantage_abs_mean_real_tokens", "|mean advantage|, real tokens"), ("reward", "mean task reward"))


def plot_ppo_whitening(axes, runs: dict, window: int) -> None:
    """|Mean advantage| on real tokens (the predicted measure: its sign differs from rollout to rollout) and reward per
    step (seed bands, legends below), and held-out accuracy (3 axes). The y labels are short: how the bands were made is
    said by ``ppo_whitening_note``."""
    plots.plot_band_panels(axes, with_absolute_advantage_mean(runs), TRAINING_PANELS, plots.bug_fix_colors(PPO_VARIANTS),
                           window=window, legend_kw=plots.LEGEND_BELOW, short_labels=True)


def figure_ppo_whitening(runs: dict, ppo_steps: int):
    """Part 2's figure: ``plot_ppo_whitening`` in two rows that fit a notebook (caption: ``ppo_whitening_note``)."""
    return plots.figure_row(lambda axes: plot_ppo_whitening(axes, runs, smoothing_window(ppo_steps)), 3, (plots.NOTEBOOK_WIDTH, 3.4),
                            columns=2)


# ---- printers -----------------------------------------------------------------------------------
def padding_lines(rows: list[dict]) -> str:
    """Part 1's numbers, one line per padding."""
    return "\n".join(f"+{r['extra_pads']:2d} pads ({r['padding_fraction']:.0%} padding): naive mean {r['naive_mean']:+.3f} "
                     f"std {r['naive_std']:.3f} | masked mean {r['masked_mean']:+.1e} std {r['masked_std']:.4f}" for r in rows)


def whitening_note(rows: list[dict]) -> str:
    """The caption printed under part 1's figure."""
    return (f"Whitened GAE advantages of one rollout, with 0–{max(r['extra_pads'] for r in rows)} pad columns added; "
            "left: their mean over real tokens, right: their std; grey lines: what whitening should give (mean 0, std 1).")


def ppo_whitening_note(runs: dict, ppo_steps: int) -> str:
    """The caption printed under part 2's figure: how the bands and the held-out panel were made."""
    return (f"Top: {plots.bands_caption(runs, smoothing_window(ppo_steps))}; left, the size of each step's mean whitened "
            "advantage over real tokens (the prediction's measure: 0 when whitening is right), right, the task reward. "
            "Bottom: held-out greedy accuracy before (□) and after (●) training, dots: seeds.")


SHOWN_EFFECTS = {"advantage_abs_mean_real_tokens": "|mean advantage|, real tokens", "reward": "task reward",
                 "heldout_accuracy": "held-out accuracy"}


def training_lines(effects: dict, runs: dict, task: str) -> str:
    """What the training cell prints (``statistics.training_summary``): the prediction and its outcome in one sentence,
    then the table of the effects a reader needs — the predicted |mean advantage| (the signed mean, whose sign differs
    from rollout to rollout, stays in metrics.json), the reward and held-out accuracy — and each variant's held-out gain."""
    shown = {name: effects[key] for key, name in SHOWN_EFFECTS.items()}
    prediction = dataclasses.replace(PREDICTION, measure=SHOWN_EFFECTS[PREDICTION.measure])
    return statistics.training_summary(shown, runs, prediction, task)


# ---- explorer -----------------------------------------------------------------------------------
def whitening_explorer(values: torch.Tensor, mask: torch.Tensor) -> Explorer:
    """P13: real-token mean/std after naive and masked whitening, as padding columns are added."""

    def draw(extra):
        rows = whitening_vs_padding(values, mask, sorted({0, extra}))
        fig, axes = plots.panel_grid(2, panel_height=3.0)
        plot_whitening(axes, rows)
        axes[0].set_title(f"0 and +{extra} pad columns")
        return rows[-1]

    return Explorer({"extra": widgets.IntSlider(value=8, min=0, max=64, description="extra pads")}, draw,
                    "Whitening over padding vs real tokens")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(rows: list[dict], runs: dict, effects: dict, settings: dict, task: str = "arith") -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 13."""
    reproduced, fixed = verdict(rows)
    worst = max(rows, key=lambda r: abs(r["naive_mean"]))
    return dict(
        notebook="13_whitening", reproduced=reproduced, fixed=fixed, not_shown=not_shown(rows),
        metrics={"naive_mean_by_padding": {str(r["extra_pads"]): r["naive_mean"] for r in rows},
                 "naive_std_by_padding": {str(r["extra_pads"]): r["naive_std"] for r in rows},
                 "masked_mean_by_padding": {str(r["extra_pads"]): r["masked_mean"] for r in rows},
                 "ppo_advantage_mean_real_tokens": {k: h[0][0]["advantage_mean_real_tokens"] for k, h in runs.items()},
                 "ppo_effects": {k: vars(e) for k, e in effects.items()}, "prediction": PREDICTION.record(effects, task),
                 "heldout_gain": statistics.heldout_gains(runs, PPO_VARIANTS), "training_settings": settings},
        headline={"what": f"mean of whitened advantages on real tokens at {worst['padding_fraction']:.0%} padding", "unit": "advantage",
                  "bug": worst["naive_mean"], "fix": worst["masked_mean"]},
    )
