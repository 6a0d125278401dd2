"""Pitfall P12: the rollout engine and the trainer disagree on log-probs.

A bf16 inference engine samples, an fp32 trainer recomputes: π_old (trainer) ≠ π_rollout even
before any update, so the "on-policy" ratio is not 1 and the policy gradient is estimated from
samples of a slightly different policy. Truncated importance sampling (verl PR #2953) reweights
each token by min(π_old / π_rollout, C).
"""

from __future__ import annotations

import copy

import ipywidgets as widgets
import torch

from workbench.core.losses import tis_weights
from workbench.experiments import statistics
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import response_logprobs
from workbench.tasks import encode_prompts
from workbench.trainers.rollout_trainer import SAMPLER_PRECISIONS
from workbench.viz import plots
from workbench.viz.explorer import Explorer

BUG, FP32, TIS = "bf16 rollout (bug)", "fp32 rollout", "bf16 rollout + TIS"
PAIRS = ((BUG, FP32), (BUG, TIS), (FP32, TIS))  # the harm, what TIS changes, and TIS against fp32
EFFECT_KEYS = ("reward", "heldout_accuracy")


# ---- measurements -------------------------------------------------------------------------------
@torch.no_grad()
def rollout_vs_trainer(model, tokenizer, prompts: list[str], *, sampler_precision: str, cap: float = 2.0, seed: int = 0) -> dict:
    """Per-token log-ratio trainer/rollout for samples of a copy of ``model`` at ``sampler_precision`` (``"bf16"``,
    ``"fp16"`` or ``"fp32"``: the values of the trainers' option of that name)."""
    if sampler_precision not in SAMPLER_PRECISIONS:
        raise ValueError(f"sampler_precision={sampler_precision!r}; use one of {tuple(SAMPLER_PRECISIONS)}")
    engine = copy.deepcopy(model).to(SAMPLER_PRECISIONS[sampler_precision])
    ids, mask = encode_prompts(tokenizer, prompts)
    rollout = sample(engine, ids, mask, max_new_tokens=8, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed))
    trainer_logp = response_logprobs(model, ids, mask, rollout.response_ids, rollout.response_mask)
    m = rollout.response_mask.bool()
    log_ratio = (trainer_logp - rollout.rollout_logprobs)[m]
    weights = tis_weights(trainer_logp, rollout.rollout_logprobs, cap)[m]
    return {
        "log_ratio": log_ratio,
        "max_ratio_deviation": float((log_ratio.exp() - 1).abs().max()),
        "mean_abs_log_ratio": float(log_ratio.abs().mean()),
        "tis_weights": weights,
        "tis_max_weight": float(weights.max()),
        "tis_clipped_fraction": float((log_ratio.exp() > cap).float().mean()),
    }


def clipped_fraction_by_cap(log_ratio: torch.Tensor, caps) -> list[float]:
    """Share of tokens whose importance ratio exceeds each cap C (the tokens TIS reweights)."""
    ratio = log_ratio.exp()
    return [float((ratio > c).float().mean()) for c in caps]


# ---- sweeps -------------------------------------------------------------------------------------
ROLLOUT_PRECISIONS = {"bf16 rollout": "bf16", "fp16 rollout": "fp16", "fp32 rollout": "fp32"}


def sweep(model, tokenizer, prompts: list[str], *, cap: float, seed: int = 0) -> dict:
    """``rollout_vs_trainer`` for a bf16, fp16 and fp32 rollout copy of ``model``."""
    return {name: rollout_vs_trainer(model, tokenizer, prompts, sampler_precision=precision, cap=cap, seed=seed)
            for name, precision in ROLLOUT_PRECISIONS.items()}


def ppo_variants(tis_cap: float) -> dict[str, dict]:
    """The PPO runs: a bf16 sampler whose log-probs are π_old (bug: ``old_logprobs="rollout"``), an fp32 sampler with π_old
    recomputed, and a bf16 sampler with π_old recomputed and truncated importance sampling at ``tis_cap``."""
    return {BUG: {"sampler_precision": "bf16", "old_logprobs": "rollout"}, FP32: {},
            TIS: {"sampler_precision": "bf16", "old_logprobs": "recompute", "tis_cap": tis_cap}}


def ppo_effects(runs: dict) -> dict:
    """``{(key, a, b): statistics.effect(runs, key, a, b)}`` for every pair in ``PAIRS``."""
    return {(key, a, b): statistics.effect(runs, key, a, b) for a, b in PAIRS for key in EFFECT_KEYS}


# ---- verdict ------------------------------------------------------------------------------------
def verdict(results: dict, *, threshold: float = 1e-2, tolerance: float = 1e-4) -> tuple[bool, bool]:
    """(reproduced, fixed): a bf16 rollout gives max |ρ − 1| > ``threshold`` before any update; an fp32
    rollout (the trainer's own precision) gives ≤ ``tolerance``, and TIS at the chosen cap acts on some
    tokens (clipped fraction > 0) — a cap above every ratio corrects nothing."""
    bf16, fp32 = results["bf16 rollout"], results["fp32 rollout"]
    return bool(bf16["max_ratio_deviation"] > threshold), \
        bool(fp32["max_ratio_deviation"] <= tolerance and bf16["tis_clipped_fraction"] > 0)


def not_shown(results: dict, *, threshold: float = 1e-2) -> str | None:
    """Why this checkpoint cannot show the mismatch, or None: an untrained checkpoint's logits are
    near zero (a near-uniform distribution), so bf16 rounding barely moves its log-probs."""
    deviation = results["bf16 rollout"]["max_ratio_deviation"]
    if deviation > threshold:
        return None
    return (f"a bf16 rollout moves this checkpoint's ratios by only {deviation:.1e} ≤ {threshold:g}: an untrained checkpoint's "
            "logits are near zero, so bf16 rounding barely changes its log-probs; use a trained one")


# Stated before any run: a bf16 sampler's log-probs used as π_old make the ratio wrong from the first
# mini-batch (clipping tokens that are on-policy), a biased update that lowers the reward against an fp32 sampler.
PREDICTION = statistics.Prediction("reward", "task reward, bf16 sampler's log-probs as π_old vs an fp32 sampler", "-")


def prediction_effects(effects: dict) -> dict:
    """The effect ``PREDICTION`` reads: bf16 sampler (bug) vs fp32 sampler on the reward."""
    return {PREDICTION.measure: effects[(PREDICTION.measure, BUG, FP32)]}


# ---- figures ------------------------------------------------------------------------------------
def plot_mismatch(axes, results: dict, cap: float, caps=None) -> None:
    """Left: histogram of the per-token log-ratio per rollout dtype. Right: share of tokens TIS clips vs the cap.
    Legends below the panels; the axis details are in ``mismatch_note``."""
    colors = {"bf16 rollout": plots.BUG_COLOR, "fp16 rollout": plots.SERIES_COLORS[4], "fp32 rollout": plots.FIX_COLOR}
    for i, (name, r) in enumerate(results.items()):
        axes[0].hist(r["log_ratio"].numpy(), bins=60, histtype="step", color=colors.get(name), label=tagged(name), log=True,
                     ls=plots.LINE_STYLES[i], lw=1.5)
    spread = max(float(r["log_ratio"].abs().max()) for r in results.values())
    hidden = [f"{name}: all {r['log_ratio'].numel()} tokens\nwithin ±{float(r['log_ratio'].abs().max()):.0e} (central bin)"
              for name, r in results.items() if float(r["log_ratio"].abs().max()) < spread / 60]
    if hidden:  # a distribution narrower than one bin is one spike at 0, drawn under the others'
        axes[0].text(0.02, 0.98, "\n".join(hidden), transform=axes[0].transAxes, ha="left", va="top", fontsize=8,
                     bbox={"facecolor": "white", "edgecolor": "none", "pad": 1, "alpha": 0.8})
    axes[0].set_xlabel("log-ratio, trainer − rollout (nats)")
    axes[0].set_ylabel("tokens")
    plots.legend_outside(axes[0], "below")
    caps = caps or sorted({1.001, 1.002, 1.005, 1.01, 1.02, 1.05, 1.1, 1.2, 1.5, 2.0, cap})
    for name, r in results.items():
        if name != "fp32 rollout":
            shares = [100 * f for f in clipped_fraction_by_cap(r["log_ratio"], caps)]
            axes[1].plot(caps, shares, "o-", color=colors.get(name), label=tagged(name))
    axes[1].axvline(cap, color=plots.NEUTRAL_COLOR, ls="--", label=f"chosen cap C = {cap}")
    axes[1].set_xlabel("TIS cap C (importance ratio)")
    axes[1].set_ylabel("tokens reweighted by TIS (%)")
    plots.legend_outside(axes[1], "below")


def tagged(name: str) -> str:
    """A sampler's legend entry: the bf16 rollout is the bug, the fp32 one (the trainer's precision) the fix."""
    return {"bf16 rollout": "bf16 rollout (bug)", "fp32 rollout": "fp32 rollout (fix)"}.get(name, name)


def figure_mismatch(results: dict, cap: float):
    """``plot_mismatch`` on two panels side by side (caption: ``mismatch_note``)."""
    return plots.figure_row(lambda axes: plot_mismatch(axes, results, cap), 2, (plots.NOTEBOOK_WIDTH, 3.4))


def smoothing_window(ppo_steps: int) -> int:
    """The moving-average window of the training figure's bands: a tenth of the run, at least 1 step."""
    return max(1, ppo_steps // 10)


PPO_PANELS = (("reward", "mean task reward"), ("kl", "KL to reference"))


def plot_ppo(axes, runs: dict, window: int) -> None:
    """Reward and KL bands of the three samplers (legends below), and held-out accuracy (3 axes). Short y labels:
    ``ppo_note`` says the rest."""
    colors = dict(zip(runs, (plots.BUG_COLOR, plots.FIX_COLOR, plots.SERIES_COLORS[2]), strict=False))
    plots.plot_band_panels(axes, runs, PPO_PANELS, colors, window=window, legend_kw=plots.LEGEND_BELOW, short_labels=True)


def figure_ppo(runs: dict, ppo_steps: int):
    """``plot_ppo`` in two rows that fit a notebook (caption: ``ppo_note``)."""
    return plots.figure_row(lambda axes: plot_ppo(axes, runs, window=smoothing_window(ppo_steps)), 3,
                            (plots.NOTEBOOK_WIDTH, 3.4), columns=2)


# ---- printers -----------------------------------------------------------------------------------
def mismatch_lines(results: dict, cap: float) -> str:
    return "\n".join(f"{name}: max |ρ−1| = {r['max_ratio_deviation']:.2e}, mean |log ρ| = {r['mean_abs_log_ratio']:.2e}, "
                     f"max ratio {r['log_ratio'].exp().max():.3f}, reweighted by TIS at C = {cap}: {r['tis_clipped_fraction']:.2%}"
                     for name, r in results.items())


def mismatch_note(results: dict, cap: float) -> str:
    """The caption printed under part 1's figure."""
    return (f"Left: log π_trainer(fp32) − log π_rollout for each sampled token of {len(results)} samplers (log count axis). "
            f"Right: the share of tokens whose importance ratio π_trainer / π_rollout exceeds a cap C — the tokens TIS "
            f"reweights — with the chosen C = {cap} dashed.")


def ppo_note(runs: dict, ppo_steps: int) -> str:
    """The caption printed under part 2's figure: what each panel shows and how its bands were made."""
    return (f"Top: mean task reward and KL to the reference (nats per response) — "
            f"{plots.bands_caption(runs, smoothing_window(ppo_steps))}. Bottom: held-out greedy accuracy before (□) and "
            "after (●) training, dots: seeds.")


def training_lines(effects: dict, runs: dict, task: str) -> str:
    """What the training cell prints: ``statistics.training_summary`` of the harm — the bf16 sampler's log-probs as π_old
    (bug) against the fp32 sampler (fix), on the reward and held-out accuracy, with each variant's held-out gain — then
    what the runs say about TIS (``tis_reading``, one line per measure); every pair's effect is in metrics.json."""
    harm = {key: effects[(key, BUG, FP32)] for key in EFFECT_KEYS}
    return "\n".join([statistics.training_summary(harm, runs, PREDICTION, task), ""] +
                     [tis_reading(*(effects[(key, a, b)] for a, b in PAIRS)) for key in EFFECT_KEYS])


def tis_reading(harm, tis_change, tis_vs_fp32) -> str:
    """What the PPO runs say about TIS, in words chosen by three ``statistics.Effect``s of one metric: bf16 vs fp32
    rollout (is there a harm?), bf16 vs bf16 + TIS (does TIS change the update?), fp32 vs bf16 + TIS (does TIS
    land where the fp32 rollout does?). TIS is called a repair only when a harm was measured and TIS removes it;
    "measurably" means larger than the seed noise (the numbers behind it: metrics.json)."""
    key = harm.key
    if not tis_change.larger_than_noise:
        return (f"{key}: TIS does not change the bf16 run measurably here (bf16 {tis_change.bug:.3g}, with TIS "
                f"{tis_change.fix:.3g})")
    if not harm.larger_than_noise:
        return (f"{key}: TIS changes the update (bf16 {tis_change.bug:.3g} → with TIS {tis_change.fix:.3g}), but the bf16 "
                f"rollout itself did no measurable harm against fp32 (bf16 {harm.bug:.3g}, fp32 {harm.fix:.3g}): a change, "
                "not a repair")
    same = not tis_vs_fp32.larger_than_noise
    return (f"{key}: the bf16 rollout differs measurably from fp32 (bf16 {harm.bug:.3g}, fp32 {harm.fix:.3g}) and TIS "
            + ("brings it to the fp32 result" if same else
               f"changes it but not to the fp32 result (fp32 {tis_vs_fp32.bug:.3g} vs TIS {tis_vs_fp32.fix:.3g})"))


# ---- explorer -----------------------------------------------------------------------------------
def log_ratio_explorer(results: dict, cap: float = 1.02) -> Explorer:
    """P12: the trainer/rollout log-ratio histogram and TIS clipped share of a rollout engine (the notebook's figure)."""

    def draw(rollout):
        result = results[rollout]
        fig, axes = plots.panel_grid(2, panel_height=3.4)  # the figure's height: room for the legends below
        plot_mismatch(axes, {rollout: result}, cap)
        fig.tight_layout()
        return {"max_ratio_deviation": result["max_ratio_deviation"]}

    return Explorer({"rollout": widgets.ToggleButtons(options=list(results), description="sampler")}, draw,
                    "Rollout engine vs trainer")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(*, results: dict, runs: dict, effects: dict, settings: dict, task: str = "arith") -> dict:
    """Notebook 12's ``notebook_api.write_metrics`` keyword arguments."""
    reproduced, fixed = verdict(results)
    return {
        "notebook": "12_logprob_mismatch", "reproduced": reproduced, "fixed": fixed, "not_shown": not_shown(results),
        "metrics": {**{n: {k: v for k, v in r.items() if not hasattr(v, "shape")} for n, r in results.items()},
                    "ppo_first_ratio_deviation": {k: h[0][0]["first_ratio_deviation"] for k, h in runs.items()},
                    "ppo_effects": {f"{key} vs {b}" if a == BUG else f"{key}: {a} vs {b}": vars(e) for (key, a, b), e in effects.items()},
                    "prediction": PREDICTION.record(prediction_effects(effects), task),
                    "heldout_gain": statistics.heldout_gains(runs), "training_settings": settings},
        "headline": {"what": "max |ρ − 1| between trainer (fp32) and rollout log-probs before any update: bf16 vs fp32 rollout",
                     "unit": "ratio", "bug": results["bf16 rollout"]["max_ratio_deviation"],
                     "fix": results["fp32 rollout"]["max_ratio_deviation"]},
    }
