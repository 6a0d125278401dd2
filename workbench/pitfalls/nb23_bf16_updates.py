"""Pitfall P23: pure-bf16 updates are rounded away.

bf16 keeps 8 significant bits (7 stored + 1 implicit): between 2^e and 2^(e+1) its numbers are
2^(e−7) apart, so a weight w can only move by at least ulp(w) = 2^(floor(log2|w|) − 7), and
round-to-nearest turns ``w + u`` back into ``w`` whenever |u| < ulp(w) / 2, i.e. when the update
is smaller than about 2^-9 to 2^-8 of the weight. Adam's first steps move every weight by about
the learning rate (m̂/√v̂ ≈ ±1), so with parameters *stored* in bf16 every weight with
|w| ≳ 2^8 · lr does not move at all: the norm gains (w ≈ 1) freeze below lr ≈ 4e-3, a typical
matrix entry (|w| ≈ 0.02) below lr ≈ 8e-5. The fix is the AMP convention ("bf16-mixed"): fp32 master weights and
optimizer state, bf16 only for the forward/backward compute, so small updates accumulate.
"""

from __future__ import annotations

import copy
import math
import random

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core import progress
from workbench.core.devices import model_device
from workbench.modeling.scoring import logprobs_from_logits
from workbench.tasks import TRAIN_PROMPTS, load_problems
from workbench.trainers.sft import sft_batch
from workbench.viz import plots
from workbench.viz.explorer import Explorer

PRECISIONS = ("fp32", "bf16-mixed", "bf16")
BF16_MANTISSA_BITS = 7  # stored; 8 significant bits with the implicit one


# ---- measurements -------------------------------------------------------------------------------
def bf16_ulp(x: float | torch.Tensor) -> torch.Tensor:
    """Spacing of bf16 numbers at |x| (normal range): 2^(floor(log2|x|) − 7)."""
    x = torch.as_tensor(x, dtype=torch.float32).abs()
    return torch.exp2(torch.floor(torch.log2(x)) - BF16_MANTISSA_BITS)


def update_survives(weight: float, update: float, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether ``weight + update`` computed and stored in ``dtype`` differs from ``weight``."""
    w = torch.tensor(weight, dtype=dtype)
    return bool((w + torch.tensor(update, dtype=dtype)) != w)


def predicted_lost_fraction(weights: torch.Tensor, step_size: float) -> float:
    """Share of ``weights`` that a move of ``step_size`` cannot change in bf16: |u| < ulp(w) / 2.

    (An update of exactly half an ulp rounds to even, so half of those ties are lost as well; the
    prediction counts them as kept.)"""
    w = weights.detach().float().flatten()
    w = w[w != 0]
    return float((step_size < bf16_ulp(w) / 2).float().mean())


def sft_batch_for(tokenizer, n: int = 64, seed: int = 0):
    """``(ids, attention_mask, loss_mask)`` of ``n`` arithmetic examples for a few SFT steps."""
    problems = load_problems(TRAIN_PROMPTS)
    return sft_batch(tokenizer, random.Random(seed).sample(problems, n))


def sft_loss(model, ids, attention_mask, loss_mask, precision: str) -> torch.Tensor:
    """The mean next-token NLL over ``loss_mask``'s tokens, the forward under bf16 autocast for ``bf16-mixed``."""
    device = model_device(model)
    ids, attention_mask, loss_mask = ids.to(device), attention_mask.to(device), loss_mask.to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        logits = model(input_ids=ids, attention_mask=attention_mask).logits[:, :-1]
    mask = loss_mask[:, 1:].float()
    return -(logprobs_from_logits(logits, ids[:, 1:]) * mask).sum() / mask.sum()


def adam_steps(model, batch, *, precision: str, lr: float, steps: int) -> dict:
    """``steps`` Adam steps of ``model`` (modified in place) on one SFT batch at ``precision``.

    ``bf16``: parameters and Adam state stored in bf16 (the hazard); ``bf16-mixed``: fp32 master
    weights and state, bf16 autocast compute (the fix); ``fp32``: everything fp32. Returns the
    losses and the share of trained entries (non-zero first gradient) that never moved."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}; use one of {PRECISIONS} ('bf16-mixed' keeps fp32 master weights)")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr}")
    model.to(torch.bfloat16 if precision == "bf16" else torch.float32).train()
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    ids, attention_mask, loss_mask = batch
    losses, trained, moved = [], {}, {}
    for step in range(steps):
        loss = sft_loss(model, ids, attention_mask, loss_mask, precision)
        optimizer.zero_grad()
        loss.backward()
        if step == 0:
            trained = {name: p.grad != 0 for name, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
        with torch.no_grad():  # which entries ever left their start value (a ±1 ulp round trip ends unchanged)
            moved = {name: moved.get(name, False) | (p != start[name]) for name, p in model.named_parameters() if name in trained}
        losses.append(float(loss.detach()))
    model.eval()
    frozen = total = returned = 0
    frozen_by_kind = {"matrices": [0, 0], "gains and biases": [0, 0]}
    for name, p in model.named_parameters():
        if name not in trained:
            continue
        unchanged = (p.detach() == start[name]) & trained[name]
        kind = "matrices" if p.dim() >= 2 else "gains and biases"
        frozen_by_kind[kind][0] += int(unchanged.sum())
        frozen_by_kind[kind][1] += int(trained[name].sum())
        frozen += int(unchanged.sum())
        returned += int((unchanged & moved[name]).sum()) if name in moved else 0
        total += int(trained[name].sum())
    return {"precision": precision, "lr": lr, "steps": steps, "losses": losses, "frozen_fraction": frozen / max(total, 1),
            "returned_fraction": returned / max(total, 1),
            "frozen_fraction_by_kind": {k: f / max(t, 1) for k, (f, t) in frozen_by_kind.items()}}


# ---- sweeps -------------------------------------------------------------------------------------
def lr_sweep(make_model, batch, learning_rates: list[float], *, steps: int, precisions=("bf16", "bf16-mixed")) -> dict:
    """``{precision: [frozen_fraction per lr]}`` with a fresh ``make_model()`` per run, plus the
    bf16 prediction |lr| < ulp(w)/2 over the initial weights (Adam's first step moves each by ≈ lr)."""
    result = {p: [] for p in precisions} | {"bf16 moved and came back": []}
    weights = torch.cat([p.detach().float().flatten() for p in make_model().parameters()])
    result["predicted (lr < ulp/2)"] = [predicted_lost_fraction(weights, lr) for lr in learning_rates]
    runs = [(precision, lr) for precision in precisions for lr in learning_rates]
    for precision, lr in progress.track(runs, "learning-rate sweep"):
        run = adam_steps(make_model(), batch, precision=precision, lr=lr, steps=steps)
        result[precision].append(run["frozen_fraction"])
        if precision == "bf16":
            result["bf16 moved and came back"].append(run["returned_fraction"])
    return result


def precision_curves(model, batch, *, lr: float, steps: int) -> dict:
    """``adam_steps`` on a copy of ``model`` in each of ``PRECISIONS``: ``{precision: run}``."""
    return {p: adam_steps(copy.deepcopy(model), batch, precision=p, lr=lr, steps=steps)
            for p in progress.track(PRECISIONS, "loss curves", unit="precision")}


def loss_drop(runs: dict) -> dict:
    """First minus last loss of each ``precision_curves`` run."""
    return {name: r["losses"][0] - r["losses"][-1] for name, r in runs.items()}


# ---- verdict ------------------------------------------------------------------------------------
def verdict(frozen_bf16: float, frozen_mixed: float, *, threshold: float = 0.5, tolerance: float = 0.01) -> tuple[bool, bool]:
    """``(reproduced, fixed)``: pure bf16 leaves most trained weights unmoved; fp32 masters leave ~none."""
    return frozen_bf16 > threshold, frozen_mixed < tolerance


# ---- figures ------------------------------------------------------------------------------------
SWEEP_STYLES = {"bf16": dict(color=plots.BUG_COLOR, marker="o"), "bf16-mixed": dict(color=plots.FIX_COLOR, marker="o"),
                "predicted (lr < ulp/2)": dict(color=plots.NEUTRAL_COLOR, ls="--"),
                "bf16 moved and came back": dict(color=plots.SERIES_COLORS[2], ls=":", marker="^")}


def plot_frozen_vs_lr(ax, learning_rates: list[float], sweep: dict, adam_steps: int) -> None:
    """``lr_sweep``: share of trained weights unchanged against the learning rate, per precision and predicted."""
    for name, values in sweep.items():
        ax.plot(learning_rates, [100 * v for v in values], label=plots.tagged(name, SWEEP_STYLES[name]["color"]), **SWEEP_STYLES[name])
    ax.set_xscale("log")
    ax.set_xlabel("Adam learning rate")
    ax.set_ylabel(f"unchanged after {adam_steps} steps (%)")
    ax.set_title("share of the trained weights an update leaves as they were", fontsize=10)
    plots.legend_outside(ax, "right")


def figure_frozen_vs_lr(learning_rates: list[float], sweep: dict, adam_steps: int):
    fig, ax = plt.subplots(figsize=(7, 3.6))
    plot_frozen_vs_lr(ax, learning_rates, sweep, adam_steps)
    fig.tight_layout()
    return fig


def plot_loss_curves(ax, runs: dict, *, lr: float, seed: int) -> None:
    """``precision_curves``: the SFT loss per Adam step in fp32, bf16-mixed (fix) and pure bf16 (bug)."""
    steps = runs["fp32"]["steps"]
    for (name, color), marker in zip((("fp32", plots.NEUTRAL_COLOR), ("bf16-mixed", plots.FIX_COLOR), ("bf16", plots.BUG_COLOR)), "sDo",
                                     strict=True):
        label = f"{plots.tagged(name, color)}: {runs[name]['frozen_fraction']:.1%} unchanged"
        ax.plot(runs[name]["losses"], label=label, color=color, marker=marker, markevery=max(1, steps // 8), markersize=4)
    ax.set_title(f"one batch (seed {seed}), full-batch Adam: deterministic, no seed band", fontsize=9)
    plots.integer_axis(ax.xaxis)
    ax.set_xlabel(f"Adam step (lr = {lr:g})")
    ax.set_ylabel("SFT loss on the batch")
    plots.legend_outside(ax, "right")


def figure_loss_curves(runs: dict, *, lr: float, seed: int):
    fig, ax = plt.subplots(figsize=(7, 3.6))
    plot_loss_curves(ax, runs, lr=lr, seed=seed)
    fig.tight_layout()
    return fig


def plot_rounding_threshold(ax, weights: torch.Tensor, lr: float, lost: float) -> None:
    """Histogram of |w| of ``weights`` with the largest |w| an update of size ``lr`` still moves in bf16
    (lr ≥ ulp(w)/2, i.e. |w| < 2⁸·lr up to the binade), labelled with ``lost`` = ``predicted_lost_fraction``."""
    w = weights.detach().float().flatten().abs()
    w = w[w != 0]
    ax.hist(w.log10().numpy(), bins=60, color=plots.SERIES_COLORS[0])
    ax.axvline(math.log10(2 ** (BF16_MANTISSA_BITS + 1) * lr), color=plots.NEUTRAL_COLOR, ls="--",
               label=f"2⁸ · lr: weights right of it ignore the update ({lost:.1%})")
    ax.set_xlabel("log10 |w|")
    ax.set_ylabel("weights")
    ax.legend(fontsize=8)


# ---- printers -----------------------------------------------------------------------------------
def rounding_lines() -> str:
    ulp = float(bf16_ulp(1.0))
    lines = [f"ulp of bf16 at 1.0: {ulp:.6f} = 2^-7; half of it: {ulp / 2:.6f}"]
    lines += [f"w = {w:g} + u = {u:g}: kept in bf16: {update_survives(w, u)}, kept in fp32: {update_survives(w, u, torch.float32)}"
              for w, u in ((1.0, 1e-4), (1.0, 5e-3), (0.02, 1e-5), (0.02, 1e-4))]
    return "\n".join(lines)


def sweep_lines(learning_rates: list[float], sweep: dict) -> str:
    predicted, back = sweep["predicted (lr < ulp/2)"], sweep["bf16 moved and came back"]
    lines = [f"lr {lr:.0e}: unchanged in pure bf16 {bug:.1%} (predicted {pred:.1%}; moved and came back {b:.1%}), "
             f"with fp32 masters {fix:.1%}"
             for lr, bug, fix, pred, b in zip(learning_rates, sweep["bf16"], sweep["bf16-mixed"], predicted, back, strict=False)]
    gap = max(range(len(learning_rates)), key=lambda i: sweep["bf16"][i] - predicted[i])
    lines.append(f"largest excess over the prediction: lr {learning_rates[gap]:.0e}, {sweep['bf16'][gap] - predicted[gap]:.1%} "
                 f"of the weights, against {back[gap]:.1%} that moved and came back to their start")
    return "\n".join(lines)


def drop_lines(drop: dict, curve_steps: int) -> str:
    return (f"loss drop over {curve_steps} steps: " + ", ".join(f"{k} {v:.4f}" for k, v in drop.items())
            + f"\npure bf16 gets {drop['bf16'] / drop['fp32']:.0%} of the fp32 drop, bf16-mixed {drop['bf16-mixed'] / drop['fp32']:.0%}")


# ---- explorer -----------------------------------------------------------------------------------
def rounding_threshold_explorer(model) -> Explorer:
    """A learning-rate slider: which of ``model``'s weights a step of that size cannot move in pure bf16."""
    weights = torch.cat([p.detach().float().flatten() for p in model.parameters() if p.requires_grad])

    def draw(lr):
        lost = predicted_lost_fraction(weights, lr)
        fig, ax = plt.subplots(figsize=(7, 3.2))
        plot_rounding_threshold(ax, weights, lr, lost)
        return {"predicted_lost_fraction": lost}

    slider = widgets.FloatLogSlider(value=1e-5, base=10, min=-8, max=-2, step=0.25, description="lr")
    return Explorer({"lr": slider}, draw, title="P23: the weights an update of size lr cannot move in bf16")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(learning_rates: list[float], sweep: dict, runs: dict, drop: dict, *, curve_steps: int, headline_lr: float) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 23."""
    reproduced, fixed = verdict(runs["bf16"]["frozen_fraction"], runs["bf16-mixed"]["frozen_fraction"])
    return dict(
        notebook="23_bf16_updates", reproduced=reproduced, fixed=fixed,
        metrics={"learning_rates": learning_rates, "frozen_fraction_sweep": sweep, "loss_drop": drop,
                 "frozen_fraction_by_kind": {k: r["frozen_fraction_by_kind"] for k, r in runs.items()}},
        headline={"what": f"trained weights unchanged after {curve_steps} Adam steps at lr {headline_lr:g}", "unit": "fraction",
                  "bug": runs["bf16"]["frozen_fraction"], "fix": runs["bf16-mixed"]["frozen_fraction"]},
    )
