"""Pitfall P6: sampling at temperature τ, recomputing log-probs at τ = 1.

The sampler draws from softmax(logits / τ). If the trainer recomputes log-probs from the raw
logits, π_train ≠ π_rollout before any update: the first-step importance ratio is not 1 (and the
gap grows as τ moves away from 1). TRL's GRPOTrainer divides by τ; top-p/top-k are not re-applied.
"""

from __future__ import annotations

from functools import partial

import ipywidgets as widgets
import torch

from workbench.experiments import statistics
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import response_logprobs
from workbench.tasks import encode_prompts
from workbench.viz import plots
from workbench.viz.explorer import Explorer, switch_explorer

PPO_VARIANTS = {"rescale_by_temperature=False (bug)": {"rescale_by_temperature": False},
                "rescale_by_temperature=True (fix)": {"rescale_by_temperature": True}}


# ---- measurements -------------------------------------------------------------------------------
@torch.no_grad()
def first_step_ratio(model, tokenizer, prompts: list[str], *, temperature: float, rescale: bool, seed: int = 0,
                     max_new_tokens: int = 8) -> dict:
    """max |ρ − 1| and mean |log ρ| when responses sampled at ``temperature`` are rescored
    at ``temperature`` (``rescale=True``, fix) or at 1 (bug)."""
    ids, mask = encode_prompts(tokenizer, prompts)
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, temperature=temperature,
                     eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                     generator=torch.Generator().manual_seed(seed))
    logp = response_logprobs(model, ids, mask, rollout.response_ids, rollout.response_mask,
                             temperature=temperature if rescale else 1.0)
    log_ratio = (logp - rollout.rollout_logprobs)[rollout.response_mask.bool()]
    return {"max_ratio_deviation": float((log_ratio.exp() - 1).abs().max()), "mean_abs_log_ratio": float(log_ratio.abs().mean())}


# ---- sweeps -------------------------------------------------------------------------------------
def sweep(model, tokenizer, prompts: list[str], temperatures, *, seed: int = 0) -> dict:
    """``first_step_ratio`` for every temperature, bug and fix: ``{(τ, rescale): result}``."""
    return {(t, rescale): first_step_ratio(model, tokenizer, prompts, temperature=t, rescale=rescale, seed=seed)
            for t in temperatures for rescale in (False, True)}


def ppo_effects(runs: dict) -> dict:
    return {key: statistics.effect(runs, key, *PPO_VARIANTS) for key in ("clip_fraction", "reward", "heldout_accuracy")}


# ---- verdict ------------------------------------------------------------------------------------
def verdict(results: dict, *, threshold: float = 1e-2, tolerance: float = 1e-4) -> tuple[bool, bool]:
    """(reproduced, fixed): at some τ ≠ 1 the unscaled recomputation gives max |ρ − 1| > ``threshold``;
    dividing by τ gives ≤ ``tolerance`` at every τ."""
    temperatures = {t for t, _ in results}
    reproduced = any(results[t, False]["max_ratio_deviation"] > threshold for t in temperatures if t != 1.0)
    fixed = all(results[t, True]["max_ratio_deviation"] <= tolerance for t in temperatures)
    return bool(reproduced), bool(fixed)


# Stated before any run: the trainer scores samples drawn at τ ≠ 1 with softmax(z) instead of
# softmax(z / τ), so the ratio is off 1 from the first mini-batch and more tokens fall outside the clip range.
PREDICTION = statistics.Prediction("clip_fraction", "share of clipped tokens (sampler at τ, trainer at 1)", "+")


# ---- figures ------------------------------------------------------------------------------------
PPO_PANELS = (("first_ratio_deviation", "max |ρ − 1|, sampler vs trainer"), ("clip_fraction", "clipped share of tokens"),
              ("reward", "mean task reward"))


def plot_ratio_vs_temperature(ax, results: dict) -> None:
    """max |ρ − 1| before any update vs τ, bug and fix; exact zeros are listed in the title, not drawn, and a point of
    one hidden under the other is ringed (at τ = 1 both are float rounding)."""
    temperatures = sorted({t for t, _ in results})
    zeros = []
    for rescale in (False, True):
        values = [results[t, rescale]["max_ratio_deviation"] for t in temperatures]
        zeros += [f"τ={t}{' (fix)' if rescale else ' (bug)'}" for t, v in zip(temperatures, values, strict=True) if v == 0]
        ax.plot(temperatures, [v if v > 0 else float("nan") for v in values], "s--" if rescale else "o-",
                color=plots.bug_fix_color(not rescale), label="logits / τ (fix)" if rescale else "raw logits (bug)")
    ax.set_yscale("log")
    ax.set_xlabel("sampling temperature τ")
    ax.set_ylabel("max |ρ − 1| before any update")
    ax.set_title("exactly 0 (not drawn): " + ", ".join(zeros) if zeros else "", fontsize=9)
    plots.note_coinciding(ax, legend_kw=plots.legend_outside(ax, "below"))


def figure_ratio_vs_temperature(results: dict):
    fig, axes = plots.panel_grid(1, width=8.0, panel_height=3.6)
    plot_ratio_vs_temperature(axes[0], results)
    fig.tight_layout()
    return fig


def plot_ppo(axes, runs: dict, window: int) -> None:
    """First-step |ρ − 1|, clipped share and reward bands, bug and fix, and held-out accuracy (4 axes); short axis
    labels and tick labels (``ppo_note`` says the rest)."""
    plots.plot_band_panels(axes, runs, PPO_PANELS, plots.bug_fix_colors(PPO_VARIANTS), window=window, log_key="first_ratio_deviation",
                           short_labels=True)
    plots.label_switch_heldout(axes[len(PPO_PANELS)], runs, "rescale_by_temperature")


def figure_ppo(runs: dict, ppo_steps: int):
    fig, axes = plots.panel_grid(4, panel_height=3.0)
    plot_ppo(axes, runs, window=max(1, ppo_steps // 10))
    plots.figure_legend(fig, axes[1], ncol=2)
    return fig


# ---- printers -----------------------------------------------------------------------------------
def ratio_lines(results: dict, temperatures) -> str:
    return "\n".join(f"τ={t:4}: bug max|ρ−1| = {results[t, False]['max_ratio_deviation']:.3e}, "
                     f"fix = {results[t, True]['max_ratio_deviation']:.1e}" for t in temperatures)


def ratio_note(results: dict, tolerance: float = 1e-4) -> str:
    """The caption of the ratio-vs-temperature figure, with the largest deviation the fix leaves (float rounding when
    ≤ ``tolerance``, ``verdict``'s)."""
    fix = max(r["max_ratio_deviation"] for (_, rescale), r in results.items() if rescale)
    return (f"max |ρ − 1| over the sampled tokens, ρ = π_trainer / π_sampler, before any update (log axis). The fix leaves "
            f"at most {fix:.1e}" + (" (float rounding)" if fix <= tolerance else "") + ".")


def ppo_note(runs: dict, ppo_steps: int) -> str:
    """The caption of the PPO figure: what the curves, bands and markers are."""
    seeds = max(len(h) for h in runs.values())
    window = max(1, ppo_steps // 10)
    curves = plots.bands_caption(runs, window)
    band = " (band: min–max over seeds)" if seeds > 1 else ""
    return (f"Curves: {curves}; max |ρ − 1| on a log axis{band}. Held-out: greedy accuracy before (□) and after (●) "
            "training" + (", dots: seeds." if seeds > 1 else "."))


# ---- explorer -----------------------------------------------------------------------------------
def temperature_explorer(model, tokenizer, prompts: list[str], seed: int = 0) -> Explorer:
    """P6: first-step max |ρ − 1| for a sampling temperature, with or without dividing by it."""

    return switch_explorer(
        partial(first_step_ratio, model, tokenizer, prompts, seed=seed), plot_ratio_vs_temperature,
        value=("temperature", widgets.FloatSlider(value=0.7, min=0.2, max=2.0, step=0.1, description="τ")),
        switch=("rescale", widgets.Checkbox(value=False, description="divide by τ (fix)")),
        title="Sampling temperature vs the recomputed log-probs")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(*, results: dict, temperatures, runs: dict, effects: dict, settings: dict, task: str = "arith") -> dict:
    """Notebook 06's ``notebook_api.write_metrics`` keyword arguments; the headline is the τ with the largest bug."""
    reproduced, fixed = verdict(results)
    worst = max((t for t in temperatures if t != 1.0), key=lambda t: results[t, False]["max_ratio_deviation"])
    return {
        "notebook": "06_temperature", "reproduced": reproduced, "fixed": fixed,
        "metrics": {**statistics.bug_fix_by_setting(results, temperatures, "max_ratio_deviation"),
                    "ppo_first_ratio_deviation": {k: h[0][0]["first_ratio_deviation"] for k, h in runs.items()},
                    "ppo_effects": {k: vars(e) for k, e in effects.items()}, "prediction": PREDICTION.record(effects, task),
                    "heldout_gain": statistics.heldout_gains(runs, PPO_VARIANTS), "training_settings": settings},
        "headline": {"what": f"max |ρ − 1| before any update, sampling at τ = {worst}", "unit": "ratio",
                     "bug": results[worst, False]["max_ratio_deviation"], "fix": results[worst, True]["max_ratio_deviation"]},
    }
