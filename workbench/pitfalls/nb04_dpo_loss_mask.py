"""Pitfall S4: the DPO loss mask that covered only the chosen prompts.

OpenRLHF's ``concatenated_forward`` stacks B chosen rows on B rejected rows and masked prompts
with ``for mask, source_len in zip(loss_masks, prompt_id_lens): mask[:source_len] = False``.
``loss_masks`` had 2B rows but ``prompt_id_lens`` B entries: ``zip`` stopped after B rows, so the
rejected log-probs still summed their prompt tokens. The margin then gains
−β[log π(prompt) − log π_ref(prompt)] from the rejected side only: 0 at step 0 (π = π_ref),
then a gradient that lowers the prompt's likelihood and inflates margins and accuracies with
something that is not preference.

``check_prompt_lengths`` raises on the count mismatch that caused it; ``audit_loss_mask`` lists
every row whose prompt tokens are counted; ``margin_decomposition`` splits the margin.
"""

from __future__ import annotations

import math
import re

import ipywidgets as widgets
import torch

from workbench.core.errors import PromptMaskError
from workbench.experiments import comparison, statistics
from workbench.experiments.statistics import Effect
from workbench.modeling.scoring import token_logprobs
from workbench.trainers.preferences import PROMPT_MASK_MODES, PreferenceBatch, build_loss_mask, prompt_target_mask, summed_logprobs
from workbench.viz import plots
from workbench.viz.explorer import Explorer

MODES = ("both", "chosen_only", "none")


# ---- measurements -------------------------------------------------------------------------------
def check_prompt_lengths(num_rows: int, prompt_lengths: list[int]) -> None:
    """Raise unless there is one prompt length per row (pass the per-row list, e.g. ``lengths * 2``)."""
    if len(prompt_lengths) != num_rows:
        raise PromptMaskError(
            f"{len(prompt_lengths)} prompt lengths for {num_rows} loss-mask rows: zip() would silently stop after "
            f"{min(len(prompt_lengths), num_rows)} rows and leave the rest of the prompts in the loss. For a "
            "concatenated chosen+rejected batch pass `prompt_lengths * 2`."
        )


def audit_loss_mask(input_ids: torch.Tensor, loss_mask: torch.Tensor, prompt_lengths: list[int]) -> list[dict]:
    """Every row whose loss mask (over targets, (2B, T−1)) counts prompt tokens.

    ``prompt_lengths`` has one entry per *pair*; rows 0..B−1 are chosen, B..2B−1 rejected.
    """
    rows = input_ids.shape[0]
    if rows != 2 * len(prompt_lengths):
        raise PromptMaskError(f"{rows} rows but {len(prompt_lengths)} pairs: expected 2 rows per pair")
    attention_mask = torch.ones_like(input_ids)
    prompt_targets = prompt_target_mask(attention_mask, prompt_lengths)
    counted = (loss_mask.bool() & prompt_targets).sum(-1)
    b = len(prompt_lengths)
    return [
        {"row": i, "side": "chosen" if i < b else "rejected", "pair": i % b, "prompt_tokens_in_loss": int(n)}
        for i, n in enumerate(counted.tolist())
        if n > 0
    ]


@torch.no_grad()
def margin_decomposition(policy, reference, batch: PreferenceBatch, beta: float) -> dict:
    """Margins h·β under each mask mode, and the rejected-side prompt term that separates them.

    Returns per-pair tensors: ``margin_both`` (response tokens only), ``margin_chosen_only``,
    and ``rejected_prompt_term`` = −β[log π(prompt) − log π_ref(prompt)] of the rejected rows,
    with ``margin_chosen_only = margin_both + rejected_prompt_term`` exactly.
    """
    b = batch.num_pairs
    out = {}
    for mode in ("both", "chosen_only"):
        mask = build_loss_mask(batch.attention_mask, batch.prompt_lengths, mode)
        pol, _ = summed_logprobs(policy, batch, mask)
        ref, _ = summed_logprobs(reference, batch, mask)
        out[f"margin_{mode}"] = beta * ((pol[:b] - ref[:b]) - (pol[b:] - ref[b:]))
    prompt = prompt_target_mask(batch.attention_mask, batch.prompt_lengths)
    pol_prompt, _ = summed_logprobs(policy, batch, prompt)
    ref_prompt, _ = summed_logprobs(reference, batch, prompt)
    out["rejected_prompt_term"] = -beta * (pol_prompt[b:] - ref_prompt[b:])
    return out


def margin_gap(decomposition: dict) -> float:
    """max |margin(chosen_only) − margin(both)| of a ``margin_decomposition``."""
    return float((decomposition["margin_chosen_only"] - decomposition["margin_both"]).abs().max())


@torch.no_grad()
def hand_margin_gap(policy, reference, batch: PreferenceBatch, beta: float) -> float:
    """max |margin(both) − the margin computed by hand over response tokens only| (independent of
    ``build_loss_mask``: the response targets are the real targets that are not prompt targets)."""
    b = batch.num_pairs
    response_only = batch.attention_mask[:, 1:].bool() & ~prompt_target_mask(batch.attention_mask, batch.prompt_lengths)

    def summed(model):
        return (token_logprobs(model, batch.input_ids, batch.attention_mask) * response_only).sum(-1)

    pol, ref = summed(policy), summed(reference)
    hand = beta * ((pol[:b] - ref[:b]) - (pol[b:] - ref[b:]))
    return float((hand - margin_decomposition(policy, reference, batch, beta)["margin_both"]).abs().max())


# ---- sweeps -------------------------------------------------------------------------------------
def mask_audits(batch: PreferenceBatch) -> dict[str, list[dict]]:
    """``audit_loss_mask`` of each mode's loss mask: the rows that count prompt tokens."""
    return {m: audit_loss_mask(batch.input_ids, build_loss_mask(batch.attention_mask, batch.prompt_lengths, m), batch.prompt_lengths)
            for m in MODES}


def training_effects(runs: dict) -> dict[str, Effect]:
    """chosen_only (bug) vs both (fix) on log p(prompt), the margin and held-out accuracy."""
    return {key: statistics.effect(runs, key, "chosen_only", "both") for key in ("logps/prompt", "rewards/margins", "heldout_accuracy")}


# ---- verdict ------------------------------------------------------------------------------------
def verdict(audits: dict, margin_gap_after: float, hand_gap: float, *, tolerance: float = 1e-5) -> tuple[bool, bool]:
    """(reproduced, fixed): the bug's mask counts rejected prompt tokens and, after training, its
    margin differs from the response-only one; the fixed mask counts no prompt token and its margin
    equals a hand computation over response tokens (≤ ``tolerance``)."""
    reproduced = any(a["side"] == "rejected" for a in audits["chosen_only"]) and margin_gap_after > 1e-4
    fixed = not audits["both"] and hand_gap <= tolerance
    return bool(reproduced), bool(fixed)


# Stated before any run: with prompt tokens in the chosen rows' log-probs only, the loss lowers the
# prompt's log-probability along with the rejected response.
PREDICTION = statistics.Prediction("logps/prompt", "log-probability of the prompt tokens (prompt masked in the rejected rows only)",
                                   "-", "nats")


# ---- figures ------------------------------------------------------------------------------------
MODE_LABELS = {"both": "both (fix)", "chosen_only": "chosen_only (bug)", "none": "none"}
TRAINING_PANELS = [("loss", "DPO loss"), ("rewards/margins", "reward margin (nats × β)"),
                   ("rewards/accuracies", "reward accuracy"), ("logps/prompt", "log p(prompt) (nats)")]


def plot_loss_mask(ax, batch: PreferenceBatch, mode: str, audit: list[dict], *, key: bool = False) -> None:
    """The loss mask of one ``prompt_mask`` mode (chosen rows on top, a line under them), titled with how many rows
    count prompt tokens (``audit``: that mode's entry of ``mask_audits``); ``key``: the colour key beside it."""
    mask = build_loss_mask(batch.attention_mask, batch.prompt_lengths, mode)
    plots.plot_mask(ax, mask, f"{MODE_LABELS[mode]}: {len(audit)} rows", xlabel="target position", ylabel="row",
                    key=key, labels=("not summed", "summed by the loss"))
    ax.axhline(batch.num_pairs - 0.5, color=plots.BUG_COLOR if mode == "chosen_only" else plots.NEUTRAL_COLOR, lw=1)


def figure_loss_masks(batch: PreferenceBatch, audits: dict[str, list[dict]]):
    """The three masks in one row, their colour key (``plot_mask``'s, drawn once) under the row."""
    fig, axes = plots.panel_grid(len(MODES), panel_height=3.0)
    for ax, mode in zip(axes, MODES, strict=True):
        plot_loss_mask(ax, batch, mode, audits[mode], key=ax is axes[-1])
    plots.figure_legend(fig, axes[-1], ncol=2)
    return fig


def plot_training_bands(axes, runs: dict) -> None:
    """Loss, margin, accuracy and log p(prompt) over seeds (``comparison.train_variants`` runs keyed by mode): mean ± std bands,
    'none' (coinciding with 'both') drawn on top, dotted, 'both' thick underneath; a fifth axis gets
    held-out greedy accuracy before/after (``plots.plot_heldout``) in the same colours. Short axis labels:
    ``training_note`` says the rest."""
    colors = {MODE_LABELS["both"]: plots.FIX_COLOR, MODE_LABELS["chosen_only"]: plots.BUG_COLOR,
              MODE_LABELS["none"]: plots.NEUTRAL_COLOR}
    styles = {MODE_LABELS["both"]: {"ls": "-", "lw": 3, "alpha": 0.6}, MODE_LABELS["chosen_only"]: {"ls": "-"},
              MODE_LABELS["none"]: {"ls": ":", "marker": "o"}}
    ordered = {MODE_LABELS[m]: runs[m] for m in ("none", "chosen_only", "both") if m in runs}
    for ax, (key, label) in zip(axes[:4], TRAINING_PANELS, strict=True):
        plots.plot_bands(ax, ordered, key, label, colors, styles=styles)
        ax.set_ylabel(label)
    if len(axes) > 4:
        plots.plot_heldout(axes[4], {MODE_LABELS[m]: r for m, r in runs.items()}, colors)
        axes[4].set_xticks(range(len(runs)), [MODE_LABELS[m].replace(" ", "\n") for m in runs], fontsize=8)
        axes[4].set_ylabel("held-out accuracy")
        axes[4].set_xlabel("□ start → ● end")


def figure_training_bands(runs: dict):
    """The four training panels and held-out accuracy in two rows of three, one legend for all in the sixth cell."""
    fig, axes = plots.panel_grid(6, panel_height=3.0)
    plot_training_bands(axes[:5], runs)
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[:5]:
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    fig.tight_layout()
    cell = axes[5].get_position()
    axes[5].remove()
    fig.legend(handles, [re.sub(r" \((n=|under ).*$", "", label) for label in labels], loc="center", fontsize=9,
               bbox_to_anchor=(cell.x0 + cell.width / 2, cell.y0 + cell.height / 2), title="prompt_mask", title_fontsize=9)
    return fig


# ---- printers -----------------------------------------------------------------------------------
def buggy_call_message(batch: PreferenceBatch) -> str:
    """What ``check_prompt_lengths`` says about the buggy call (one prompt length per *pair*, not per row)."""
    try:
        check_prompt_lengths(batch.input_ids.shape[0], batch.prompt_lengths)
    except PromptMaskError as error:
        return f"check_prompt_lengths on the buggy call: {error}"
    return "check_prompt_lengths on the buggy call: no error (one prompt length per row)"


def loss_masks_note(batch: PreferenceBatch) -> str:
    """The caption of the loss-mask figure."""
    b = batch.num_pairs
    return (f"Rows 0–{b - 1}: prompt + chosen, rows {b}–{2 * b - 1}: prompt + rejected (below the line), right-padded. "
            "Title: the rows whose prompt tokens the loss sums.")


def training_note(runs: dict) -> str:
    """The caption of the training figure: what the lines, bands and markers are."""
    seeds = max(len(h) for h in runs.values())
    lines = plots.bands_caption(runs, window=1)
    return (f"Curves: {lines}; 'none' (dotted) lies on 'both' (thick): their margins are the same, rings mark where one "
            "hides the other. Reward accuracy: share of pairs whose implicit reward prefers the chosen answer. Held-out: "
            "greedy accuracy before (□) and after (●) training" + (", dots: seeds." if seeds > 1 else "."))


def trained_margin_lines(after: dict, hand_gap: float) -> str:
    return (f"bug run: mean margin {after['margin_chosen_only'].mean():.3f} = response-only {after['margin_both'].mean():.3f} "
            f"+ rejected prompt term {after['rejected_prompt_term'].mean():.3f}\n"
            f"fixed run: margin vs a hand computation over response tokens only: max |Δ| = {hand_gap:.1e}")


def accuracy_conclusion(before: float, after: dict[str, float], n: int) -> str:
    """Held-out greedy accuracy before/after DPO per mode, against the binomial noise √(p(1−p)/n)."""
    noise = 2 * (max(before * (1 - before), 1 / n) / n) ** 0.5
    changes = {m: a - before for m, a in after.items()}
    spread = max(after.values()) - min(after.values())
    parts = ", ".join(f"{m}: {a:.3f} ({changes[m]:+.3f})" for m, a in after.items())
    if all(c < -noise for c in changes.values()):
        verdict = ("every mode, the fix included, lowers it by more than the noise: DPO on these preference pairs moves "
                   "greedy answers away from the task's exact answers, whatever the mask")
    elif all(abs(c) <= noise for c in changes.values()):
        verdict = "no mode changes it by more than the noise"
    else:
        verdict = "the modes differ"
    mask_effect = "larger" if spread > noise else "not larger"
    return (f"greedy accuracy on {n} held-out prompts: before {before:.3f}; after {parts}; noise ±{noise:.3f}: {verdict}. "
            f"Spread between masks {spread:.3f}: {mask_effect} than the noise.")


def heldout_explanation(heldout: Effect, chosen: Effect, rejected: Effect) -> str:
    """Why the *fixed* DPO run's held-out greedy accuracy moves, from its numbers: ``statistics.gain(runs,
    "both")`` and ``gain(runs, "both", key)`` for ``heldout_logp_chosen`` / ``heldout_logp_rejected``
    (summed response log-probs of held-out preference pairs, before → after)."""
    def change(effect: Effect, digits: int) -> str:
        noise = f" ± {effect.noise:.{digits}f}" if math.isfinite(effect.noise) else ""
        return f"{effect.difference:+.{digits}f}{noise}"

    spread = (f"mean of {chosen.seeds} seeds, ± one standard error" if math.isfinite(heldout.noise)
              else "one seed: no spread to give a standard error")
    numbers = (f"fixed mask ({spread}): held-out greedy accuracy {heldout.fix:.3f} → {heldout.bug:.3f} "
               f"({change(heldout, 3)}); on held-out pairs log p(chosen) {chosen.fix:.2f} → {chosen.bug:.2f} nats "
               f"({change(chosen, 2)}), log p(rejected) {rejected.fix:.2f} → {rejected.bug:.2f} ({change(rejected, 2)})")
    if not math.isfinite(heldout.noise):
        return numbers + ": with one seed there is no noise to test the change against."
    if heldout.no_spread:
        return numbers + ": held-out accuracy moved by the same amount in every seed, so there is no spread to test it against."
    if not heldout.larger_than_noise:
        return numbers + ": no change in held-out accuracy beyond the seed noise."
    if heldout.difference < 0 and chosen.larger_than_noise and chosen.difference < 0:
        faster = " the rejected faster," if rejected.difference < chosen.difference else ""
        return (numbers + ": accuracy falls with the mask fixed, and the chosen (correct) answers themselves became less "
                f"likely. DPO only widens the margin log π(chosen) − log π(rejected); here it pushes both down,{faster} so "
                "probability leaves the correct answer for answers the pairs never name; the mask is fixed in this run, so "
                "this is DPO on these pairs, not the bug.")
    return numbers + ": held-out accuracy moves beyond the seed noise without the chosen answers losing probability."


def heldout_reading(runs: dict) -> str:
    keys = ("heldout_accuracy", "heldout_logp_chosen", "heldout_logp_rejected")
    return heldout_explanation(*(statistics.gain(runs, "both", k) for k in keys))


# ---- explorer -----------------------------------------------------------------------------------
def dpo_mask_explorer(batch: PreferenceBatch, audits: dict[str, list[dict]]) -> Explorer:
    """The loss mask of a concatenated chosen+rejected batch for each prompt_mask mode (``audits``: ``mask_audits(batch)``)."""
    def draw(prompt_mask):
        fig, axes = plots.panel_grid(1, width=7.0, panel_height=3.0)
        plot_loss_mask(axes[0], batch, prompt_mask, audits[prompt_mask], key=True)
        axes[0].set_ylabel(f"row (rejected from {batch.num_pairs})")
        fig.tight_layout()
        return {"rows_counting_prompt": len(audits[prompt_mask])}

    controls = {"prompt_mask": widgets.ToggleButtons(options=list(PROMPT_MASK_MODES), value="chosen_only", description="mask")}
    return Explorer(controls, draw, "DPO loss mask: toggle the bug")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(*, audits: dict, margin_gap_step0: float, margin_gap_after: float, hand_gap: float, runs: dict, effects: dict,
            train_steps: int, task: str = "arith") -> dict:
    """Notebook 04's ``notebook_api.write_metrics`` keyword arguments."""
    reproduced, fixed = verdict(audits, margin_gap_after, hand_gap)
    histories = comparison.first_seed(runs)
    return {
        "notebook": "04_dpo_loss_mask", "reproduced": reproduced, "fixed": fixed,
        "metrics": {"margin_gap_step0": margin_gap_step0,
                    "prompt_logp_drift": {m: histories[m][-1]["logps/prompt"] - histories[m][0]["logps/prompt"] for m in MODES},
                    "final_margin": {m: histories[m][-1]["rewards/margins"] for m in MODES},
                    "final_accuracy": {m: histories[m][-1]["rewards/accuracies"] for m in MODES},
                    "heldout_gain": {m: vars(statistics.gain(runs, m)) for m in MODES}, "effects": {k: vars(e) for k, e in effects.items()},
                    "prediction": PREDICTION.record(effects, task),
                    "heldout_logp_chosen_fix": vars(statistics.gain(runs, "both", "heldout_logp_chosen")),
                    "rows_counting_prompt_tokens": {m: len(audits[m]) for m in MODES},
                    "margin_gap_after_training": margin_gap_after, "fixed_margin_vs_hand": hand_gap},
        "headline": {"what": f"DPO reward margin, last quarter of {train_steps} steps, mean over {len(runs['both'])} seed(s) "
                             "(inflated by the prompt term under the bug)", "unit": "nats × β",
                     "bug": effects["rewards/margins"].bug, "fix": effects["rewards/margins"].fix},
    }
