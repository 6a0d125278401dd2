"""Pitfall P7: dropout left on in the policy and the reference during RL.

With dropout active, two forwards of the same weights draw different masks: the log-probs the
sampler recorded, the trainer's recomputation and the reference's all disagree, so at step 0
the importance ratio is not 1 and the KL to an identical reference is not 0. The fix
(``workbench.modeling.dropout.disable_dropout``, TRL's ``disable_dropout``) sets every probability to 0.
"""

from __future__ import annotations

import copy
from functools import partial

import ipywidgets as widgets
import torch

from workbench.core import progress
from workbench.experiments import statistics
from workbench.modeling.dropout import disable_dropout
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import response_logprobs
from workbench.tasks import encode_prompts
from workbench.viz import plots
from workbench.viz.explorer import Explorer, switch_explorer
from workbench.viz.plots import note_coinciding

PPO_DROPOUT = 0.1  # dropout of the PPO runs (set by ``set_dropout`` before training)
PPO_VARIANTS = {"disable_dropout=False (bug)": {"disable_dropout": False}, "disable_dropout=True (fix)": {"disable_dropout": True}}


# ---- measurements -------------------------------------------------------------------------------
def set_dropout(model, p: float) -> None:
    """Switch dropout on at probability ``p`` everywhere it exists (modules and attention)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = p
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = p


@torch.no_grad()
def step0_mismatch(model, tokenizer, prompts: list[str], *, dropout: float, disable: bool, seed: int = 0) -> dict:
    """Ratio and KL at step 0 for a model with dropout ``dropout``; ``disable`` applies the fix."""
    policy = copy.deepcopy(model)
    set_dropout(policy, dropout)
    if disable:
        disable_dropout(policy)
    reference = copy.deepcopy(policy)
    policy.train()
    reference.train()  # the bug: nobody called eval()
    torch.manual_seed(seed)
    ids, mask = encode_prompts(tokenizer, prompts)
    rollout = sample(policy, ids, mask, max_new_tokens=8, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed))
    logp = response_logprobs(policy, ids, mask, rollout.response_ids, rollout.response_mask)
    ref = response_logprobs(reference, ids, mask, rollout.response_ids, rollout.response_mask)
    m = rollout.response_mask.bool()
    log_ratio = (logp - rollout.rollout_logprobs)[m]
    return {
        "max_ratio_deviation": float((log_ratio.exp() - 1).abs().max()),
        "median_abs_log_ratio": float(log_ratio.abs().median()),  # a stable summary: the max is one token's extreme
        "tokens": int(m.sum()),
        "sequence_kl_k1": float(((rollout.rollout_logprobs - ref) * rollout.response_mask).sum(-1).mean()),
        "max_abs_token_kl": float((rollout.rollout_logprobs - ref)[m].abs().max()),
    }


# ---- sweeps -------------------------------------------------------------------------------------
def sweep(model, tokenizer, prompts: list[str], dropouts, *, seed: int = 0) -> dict:
    """``step0_mismatch`` for every dropout probability, bug and fix: ``{(p, disable): result}``."""
    settings = [(d, disable) for d in dropouts for disable in (False, True)]
    return {(d, disable): step0_mismatch(model, tokenizer, prompts, dropout=d, disable=disable, seed=seed)
            for d, disable in progress.track(settings, "dropout sweep", unit="setting")}


def ppo_effects(runs: dict) -> dict:
    return {"reward_step0": statistics.effect(runs, "reward", *PPO_VARIANTS, at="start"),
            "reward_end": statistics.effect(runs, "reward", *PPO_VARIANTS),
            "reward_learnt": statistics.learnt_gap(runs, "reward", *PPO_VARIANTS),
            "heldout_accuracy": statistics.effect(runs, "heldout_accuracy", *PPO_VARIANTS)}


# ---- verdict ------------------------------------------------------------------------------------
def verdict(results: dict, *, threshold: float = 1e-2, tolerance: float = 1e-4) -> tuple[bool, bool]:
    """(reproduced, fixed): with some dropout > 0 left on, max |ρ − 1| at step 0 exceeds ``threshold``;
    with dropout disabled ρ − 1 and the KL to an identical reference are ≤ ``tolerance`` everywhere."""
    dropouts = {d for d, _ in results}
    reproduced = any(results[d, False]["max_ratio_deviation"] > threshold for d in dropouts if d > 0)
    fixed = all(results[d, True]["max_ratio_deviation"] <= tolerance and abs(results[d, True]["sequence_kl_k1"]) <= tolerance
                for d in dropouts)
    return bool(reproduced), bool(fixed)


# Stated before any run: sampling with dropout active draws from a noisier policy than the one being
# trained, so the reward of the very first batch is already lower with the bug.
PREDICTION = statistics.Prediction("reward_step0", "task reward of the first sampled batch (dropout on while sampling)", "-")


# ---- figures ------------------------------------------------------------------------------------
PPO_PANELS = (("train_ratio_deviation", "max |ρ − 1|, 1st mini-batch"), ("kl", "KL to reference (nats)"),
              ("reward", "mean task reward"))


def plot_step0(axes, results: dict) -> None:
    """max |ρ − 1| and |KL| to an identical reference at step 0 vs the dropout probability; exact
    zeros are counted in the titles, not drawn."""
    dropouts = sorted({d for d, _ in results})
    for ax, key, label in ((axes[0], "max_ratio_deviation", "max |ρ − 1| at step 0"),
                           (axes[1], "sequence_kl_k1", "|KL(k1)| per response (nats)")):
        zeros = 0
        for disable in (False, True):
            values = [abs(results[d, disable][key]) for d in dropouts]
            zeros += sum(v == 0 for v in values)
            ax.plot(dropouts, [v if v > 0 else float("nan") for v in values], "s--" if disable else "o-",
                    color=plots.bug_fix_color(not disable), label="dropout disabled (fix)" if disable else "dropout on (bug)")
        ax.set_yscale("log")
        ax.set_xlabel("dropout probability")
        ax.set_ylabel(label)
        ax.set_title(f"{zeros} point(s) exactly 0, not drawn" if zeros else "", fontsize=9)
    for ax in axes:
        note_coinciding(ax)


def figure_step0(results: dict):
    fig, axes = plots.panel_grid(2, panel_height=3.3)
    plot_step0(axes, results)
    plots.figure_legend(fig, axes[0], ncol=2)
    return fig


def plot_ppo(axes, runs: dict) -> None:
    """First-mini-batch |ρ − 1|, KL and reward bands, bug and fix, and held-out accuracy (4 axes); short axis labels
    and tick labels (``ppo_note`` says the rest)."""
    plots.plot_band_panels(axes, runs, PPO_PANELS, plots.bug_fix_colors(PPO_VARIANTS), log_key="train_ratio_deviation",
                           short_labels=True)
    plots.label_switch_heldout(axes[len(PPO_PANELS)], runs, "disable_dropout")


def figure_ppo(runs: dict):
    fig, axes = plots.panel_grid(4, panel_height=3.0)
    plot_ppo(axes, runs)
    plots.figure_legend(fig, axes[2], ncol=2)
    return fig


# ---- printers -----------------------------------------------------------------------------------
def step0_lines(results: dict, dropouts) -> str:
    return "\n".join(
        f"dropout {d}: max |ρ−1| on {results[d, False]['max_ratio_deviation']:.2e} / "
        f"disabled {results[d, True]['max_ratio_deviation']:.1e}; "
        f"KL to an identical reference on {results[d, False]['sequence_kl_k1']:+.2e} / disabled {results[d, True]['sequence_kl_k1']:+.1e}"
        for d in dropouts)


def step0_note(results: dict) -> str:
    """Max vs median of |log ρ| over the dropout sweep with dropout left on: whether each rises with the
    probability. The max is the one most extreme token of a heavy tail, so it need not follow the trend."""
    dropouts = sorted(d for d, disable in results if not disable)
    maxima = [results[d, False]["max_ratio_deviation"] for d in dropouts]
    medians = [results[d, False]["median_abs_log_ratio"] for d in dropouts]

    def rising(v):
        return all(b >= a for a, b in zip(v, v[1:], strict=False))

    line = "median |log ρ| per token, dropout on: " + ", ".join(f"{d}: {m:.2g}" for d, m in zip(dropouts, medians, strict=True))
    line += f" ({'rises' if rising(medians) else 'does not rise'} with the probability)"
    if not rising(maxima):
        line += ("; max |ρ − 1| does not: it is exp of the single largest log-ratio among "
                 f"~{results[dropouts[-1], False]['tokens']} tokens, a heavy-tail extreme that jumps between runs and grows with "
                 "the number of tokens it is taken over — read the median for the trend")
    return line


def step0_figure_note(results: dict, tolerance: float = 1e-4) -> str:
    """The caption of the step-0 figure, with the largest value the fix leaves (float rounding when ≤ ``tolerance``,
    ``verdict``'s)."""
    fix = max(max(abs(r["max_ratio_deviation"]), abs(r["sequence_kl_k1"])) for (_, disable), r in results.items() if disable)
    return ("Left: the largest |ρ − 1| over the sampled tokens; right: |KL(k1)| to an identical reference, summed over "
            f"each response's tokens, mean over responses. Log axes; dropout disabled leaves at most {fix:.1e}"
            + (" (float rounding)" if fix <= tolerance else "") + "; rings: a point where one series hides the other.")


def ppo_note(runs: dict) -> str:
    """The caption of the PPO figure: what the curves, bands and markers are."""
    seeds = max(len(h) for h in runs.values())
    curves = plots.bands_caption(runs, window=1)
    band = "band: min–max over seeds; " if seeds > 1 else ""
    return (f"Curves: {curves}; max |ρ − 1| on a log axis ({band}an exact 0 is drawn on the dotted floor line). KL: per "
            "response. Held-out: greedy accuracy in eval mode before (□) and after (●) training"
            + (", dots: seeds." if seeds > 1 else "."))


def first_minibatch_note(runs: dict, results: dict) -> str:
    """PPO's first-mini-batch |ρ − 1| per seed beside the step-0 sweep at the same dropout (not comparable maxima)."""
    if (PPO_DROPOUT, False) not in results:
        return ""
    first = [h[0]["train_ratio_deviation"] for h in runs[next(iter(PPO_VARIANTS))]]
    return (f"max |ρ − 1| on PPO's first mini-batch, dropout {PPO_DROPOUT}, per seed: {', '.join(f'{v:.2g}' for v in first)}; "
            f"step-0 sweep at {PPO_DROPOUT}: {results[PPO_DROPOUT, False]['max_ratio_deviation']:.2g} — maxima over different "
            "tokens (another batch), not comparable values")


# ---- explorer -----------------------------------------------------------------------------------
def dropout_explorer(model, tokenizer, prompts: list[str], seed: int = 0) -> Explorer:
    """P7: step-0 ratio and KL for a dropout probability, with or without disabling dropout."""

    def plot_with_legend(axes, results):  # the two panels share one legend under them: which marker is the fix
        plot_step0(axes, results)
        plots.figure_legend(axes[0].figure, axes[0], ncol=2)

    return switch_explorer(
        partial(step0_mismatch, model, tokenizer, prompts, seed=seed), plot_with_legend, figsize=(plots.NOTEBOOK_WIDTH, 3.3),
        panels=2,
        value=("dropout", widgets.FloatSlider(value=0.1, min=0.0, max=0.5, step=0.01, description="dropout")),
        switch=("disable", widgets.Checkbox(value=False, description="disable dropout (fix)")),
        title="Dropout during RL: step-0 ratio and KL")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(*, results: dict, dropouts, runs: dict, effects: dict, settings: dict, task: str = "arith") -> dict:
    """Notebook 07's ``notebook_api.write_metrics`` keyword arguments; the headline is the largest dropout measured."""
    reproduced, fixed = verdict(results)
    worst = max(d for d in dropouts if d > 0) if any(d > 0 for d in dropouts) else dropouts[0]
    return {
        "notebook": "07_dropout", "reproduced": reproduced, "fixed": fixed,
        "metrics": {**statistics.bug_fix_by_setting(results, dropouts, "max_ratio_deviation"),
                    "sequence_kl_bug": {str(d): results[d, False]["sequence_kl_k1"] for d in dropouts},
                    "ppo_train_ratio_deviation": {k: h[0][0]["train_ratio_deviation"] for k, h in runs.items()},
                    "ppo_effects": {k: vars(e) for k, e in effects.items()}, "prediction": PREDICTION.record(effects, task),
                    "heldout_gain": statistics.heldout_gains(runs, PPO_VARIANTS), "training_settings": settings},
        "headline": {"what": f"max |ρ − 1| at step 0 with dropout {worst}", "unit": "ratio",
                     "bug": results[worst, False]["max_ratio_deviation"], "fix": results[worst, True]["max_ratio_deviation"]},
    }
