"""Pitfall P10: gradient accumulation with a token-mean loss.

With micro-batches of different token counts, averaging each micro-batch's token mean is not the
token mean of the accumulated batch: tokens in short micro-batches weigh more (the 2024
gradient-accumulation loss bug in transformers). The fix divides each micro-batch's token *sum*
by the token count of the whole accumulated batch.
"""

from __future__ import annotations

import random

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core.batching import pad_sequences
from workbench.modeling.scoring import token_logprobs
from workbench.viz import plots
from workbench.viz.explorer import Explorer

# ---- measurements -------------------------------------------------------------------------------
NORMALIZATIONS = ("global", "per_micro_batch")


def policy_gradient_loss_sum(model, ids, mask, advantages) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ over real targets of −A·log p, and the number of those targets."""
    logp = token_logprobs(model, ids, mask)
    targets = (mask[:, 1:] * mask[:, :-1]).float()
    return -(advantages[:, None] * logp * targets).sum(), targets.sum()


def accumulated_gradient(model, ids, mask, advantages, *, micro_batches: int, normalization: str) -> torch.Tensor:
    """The gradient after accumulating ``micro_batches`` micro-batches (rows in order)."""
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization={normalization!r}; choose one of {NORMALIZATIONS}")
    model.zero_grad(set_to_none=True)
    chunks = torch.arange(ids.shape[0]).chunk(micro_batches)
    total_tokens = float((mask[:, 1:] * mask[:, :-1]).sum())
    for rows in chunks:
        loss_sum, tokens = policy_gradient_loss_sum(model, ids[rows], mask[rows], advantages[rows])
        if normalization == "global":
            loss = loss_sum / total_tokens
        else:  # the bug: each micro-batch's own token mean, averaged over micro-batches
            loss = loss_sum / tokens.clamp_min(1) / len(chunks)
        loss.backward()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return grad


def full_batch_gradient(model, ids, mask, advantages) -> torch.Tensor:
    return accumulated_gradient(model, ids, mask, advantages, micro_batches=1, normalization="global")


def relative_error(gradient: torch.Tensor, reference: torch.Tensor) -> float:
    return float((gradient - reference).norm() / reference.norm())


def length_sorted_batch(tokenizer, batch_size: int, *, seed: int = 0, lengths=(2, 3, 4, 8, 16, 32)):
    """A right-padded batch of random sequences sorted by length (as length-grouped samplers give),
    so micro-batches differ in token count, with advantages ±1: ``(ids, mask, advantages)``."""

    rng = random.Random(seed)
    sizes = sorted(rng.choice(lengths) for _ in range(batch_size))
    bos = tokenizer.bos_token_id  # None for Qwen2-style tokenizers: the row then starts with a random token
    rows = [[bos if bos is not None else rng.randrange(4, len(tokenizer))] + [rng.randrange(4, len(tokenizer)) for _ in range(n)]
            for n in sizes]
    ids, mask = pad_sequences(rows, tokenizer.pad_token_id, side="right")
    return ids, mask, torch.tensor([rng.choice([-1.0, 1.0]) for _ in rows])


# ---- sweeps -------------------------------------------------------------------------------------
def sweep(model, ids, mask, advantages, micro_batch_counts) -> dict[str, list[float]]:
    """Relative gradient error against the full batch, per normalisation and micro-batch count."""
    reference = full_batch_gradient(model, ids, mask, advantages)
    return {n: [relative_error(accumulated_gradient(model, ids, mask, advantages, micro_batches=k, normalization=n), reference)
                for k in micro_batch_counts] for n in ("per_micro_batch", "global")}


# ---- verdict ------------------------------------------------------------------------------------
def verdict(errors: dict[str, list[float]], *, threshold: float = 1e-2, tolerance: float = 1e-5) -> tuple[bool, bool]:
    """(reproduced, fixed): the mean of micro-batch means misses the full-batch gradient by more than
    ``threshold`` (relative) somewhere; global normalisation matches it within ``tolerance`` everywhere."""
    return bool(max(errors["per_micro_batch"]) > threshold), bool(max(errors["global"]) <= tolerance)


# ---- figures ------------------------------------------------------------------------------------
def plot_gradient_error(ax, micro_batch_counts, errors: dict[str, list[float]]) -> None:
    """Relative gradient error vs the number of micro-batches; exact zeros are written at the bottom, not drawn."""
    for normalization, bug in (("per_micro_batch", True), ("global", False)):
        values = errors[normalization]
        ax.plot(micro_batch_counts, [v if v > 0 else float("nan") for v in values], "o-" if bug else "s--",
                color=plots.bug_fix_color(bug),
                label="mean of micro-batch token means (bug)" if bug else "micro-batch sums / global token count (fix)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlim(min(micro_batch_counts) / 1.8, max(micro_batch_counts) * 1.3)  # room for the "0 (…)" note of the first count
    ax.set_xticks(list(micro_batch_counts), [str(k) for k in micro_batch_counts])
    for i, k in enumerate(micro_batch_counts):  # exact zeros: one "0" per count, coloured by who has it
        zero = [bug for normalization, bug in (("per_micro_batch", True), ("global", False)) if errors[normalization][i] == 0]
        if zero:
            text = "0 (bug and fix)" if len(zero) == 2 else f"0 ({'bug' if zero[0] else 'fix'})"
            ax.annotate(text, (k, 0), xycoords=("data", "axes fraction"), xytext=(0, 3), textcoords="offset points", ha="center",
                        va="bottom", color=plots.NEUTRAL_COLOR if len(zero) == 2 else plots.bug_fix_color(zero[0]), fontsize=8)
    ax.set_xlabel("micro-batches accumulated")
    ax.set_ylabel("relative gradient error")
    plots.legend_outside(ax, "below")


def figure_gradient_error(micro_batch_counts, errors: dict[str, list[float]]):
    """``plot_gradient_error`` on one panel, its legend below (caption: ``gradient_error_note``)."""
    return plots.figure_panels((7.5, 4.4), lambda ax: plot_gradient_error(ax, micro_batch_counts, errors))


# ---- printers -----------------------------------------------------------------------------------
def gradient_error_note(errors: dict[str, list[float]]) -> str:
    """The caption printed under the figure."""
    zeros = any(v == 0 for values in errors.values() for v in values)
    return ("Relative error ‖g_accumulated − g_full‖ / ‖g_full‖ of the accumulated gradient against one backward pass over "
            "the whole batch, log axis" + ("; an exact 0 has no place on it and is written as 0 at the bottom." if zeros else "."))


def error_lines(micro_batch_counts, errors: dict[str, list[float]]) -> str:
    return "\n".join(f"{k:2d} micro-batches: relative error {bug:.2e} (mean of means) vs {fix:.1e} (global token count)"
                     for k, bug, fix in zip(micro_batch_counts, errors["per_micro_batch"], errors["global"], strict=True))


# ---- explorer -----------------------------------------------------------------------------------
def grad_accumulation_explorer(mask: torch.Tensor, micro_batch_counts: list[int], errors: dict | None = None) -> Explorer:
    """P10: the notebook's figure — relative gradient error vs micro-batches (``errors`` from
    ``grad_accumulation.sweep``), the chosen count marked — above the per-token weights of that split,
    bug (mean of means) vs fix (global token count). Without ``errors`` only the weights are drawn."""

    def draw(micro_batches):
        chunks = torch.arange(mask.shape[0]).chunk(micro_batches)
        tokens = [int(mask[c].sum()) for c in chunks]
        bug = [1 / t / len(tokens) for t in tokens]
        result = {"tokens": tokens, "bug_weights": bug, "fix_weight": 1 / sum(tokens)}
        if errors is not None:
            fig, (ax, weights_ax) = plt.subplots(2, 1, figsize=(7, 6.5), height_ratios=(2, 1))
            plot_gradient_error(ax, micro_batch_counts, errors)
            i = list(micro_batch_counts).index(micro_batches)
            ax.axvline(micro_batches, color=plots.NEUTRAL_COLOR, lw=0.8, ls=":")
            result.update(error_bug=errors["per_micro_batch"][i], error_fix=errors["global"][i])
            split = f"{micro_batches} micro-batch" + ("es" if micro_batches != 1 else "")
            ax.set_title(f"{split}: relative error {result['error_bug']:.2e} (bug) vs "
                         f"{result['error_fix']:.1e} (fix)", fontsize=9)
        else:
            fig, weights_ax = plt.subplots(figsize=(6, 2.5))
        weights_ax.bar(range(len(tokens)), bug, color=plots.BUG_COLOR, label="per-token weight, bug")
        weights_ax.axhline(1 / sum(tokens), color=plots.FIX_COLOR, label="per-token weight, fix")
        ticks = range(0, len(tokens), max(1, len(tokens) // 8))  # whole micro-batches, numbered from 1
        weights_ax.set_xticks(ticks, [str(i + 1) for i in ticks])
        weights_ax.set_xlabel("micro-batch")
        weights_ax.set_ylabel("weight")
        plots.legend_outside(weights_ax, "right")
        fig.tight_layout()
        return result

    control = widgets.Dropdown(options=list(micro_batch_counts), value=micro_batch_counts[-1], description="micro-batches")
    return Explorer({"micro_batches": control}, draw, "Gradient error and token weights under accumulation")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(*, micro_batch_counts, errors: dict[str, list[float]]) -> dict:
    """Notebook 10's ``notebook_api.write_metrics`` keyword arguments."""
    reproduced, fixed = verdict(errors)
    return {
        "notebook": "10_grad_accumulation", "reproduced": reproduced, "fixed": fixed,
        "metrics": {"relative_gradient_error_bug": dict(zip(map(str, micro_batch_counts), errors["per_micro_batch"], strict=True)),
                    "relative_gradient_error_fix": dict(zip(map(str, micro_batch_counts), errors["global"], strict=True))},
        "headline": {"what": f"relative gradient error with {max(micro_batch_counts)} micro-batches", "unit": "‖Δg‖/‖g‖",
                     "bug": errors["per_micro_batch"][-1], "fix": errors["global"][-1]},
    }
