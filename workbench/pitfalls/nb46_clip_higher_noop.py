"""Pitfall P46: clip-higher that never fires — a ratio computed against a detached copy of the *current* log-probs.

GRPO code written for one update per generation often writes the importance ratio as
``exp(logp − logp.detach())``: its value is exactly 1 and its gradient is ∇logp, which is right for the first update
(θ = θ_old). Run several updates on the same rollouts — PPO epochs, several mini-batches, DAPO's setting — and the
ratio should move away from 1 and the clip act; with the detached copy it is still 1 at every epoch, so
``clip(ρ, 1 − ε_low, 1 + ε_high)`` is the identity: DAPO's asymmetric clip-higher (ε_high > ε_low) changes nothing, the
clip fractions log 0 and the update is an unclipped policy gradient (verl issue #801, March 2025; AReno issue #485,
2026, the same surrogate; verl #791 and #1477 ask why clip-higher helps at ``ppo_epochs=1``, where the *real* ratio is 1
on the first mini-batch too). The fix: ``ρ = exp(logp − old_logp)`` with ``old_logp`` stored once before the first
update (the sampler's, or the trainer's recomputation).

A second, smaller error sits in the logging: a clip fraction counted as "ρ outside [1 − ε_low, 1 + ε_high]" is not the
share of tokens whose gradient was clipped. PPO's min clips ρ > 1 + ε_high only where A > 0 and ρ < 1 − ε_low only
where A < 0 (verl's ``pg_clipfrac`` compares the two losses, which gates by the sign; verl PR #972 fixed a
``pg_clipfrac_lower`` that was always 0).

The measurement needs no model: a tabular softmax policy (each token position's logits are free parameters, drawn at
random) is sampled once, then trained for a few full-batch PPO epochs with Adam. Per epoch: the clip fraction the loss
sees, the true one (ρ against the stored old log-probs), the true max |ρ − 1|, the gradient of the detached surrogate
against the correct one at the same parameters, and whether ε_high changes the trajectory at all.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.viz import plots
from workbench.viz.explorer import Explorer

RATIOS = {"detached": "exp(lp − lp.detach()) (bug)", "old": "exp(lp − old_lp) (fix)"}


# ---- measurements --------------------------------------------------------------------------------
def tabular_batch(n_sequences: int, length: int, vocab: int, *, n_contexts: int = 32, logit_std: float = 2.0,
                  seed: int = 0) -> dict:
    """A sampled batch from a tabular softmax policy: ``n_contexts`` contexts with logits ``[n_contexts, vocab]`` ~
    N(0, logit_std²) (the parameters); each of the ``n_sequences × length`` positions is one of them at random, so
    tokens of sequences with opposite advantages share parameters, as they do in a model. One token is drawn at each
    position, its log-prob stored as ``old_logp``; one standardised advantage per sequence."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n_contexts, vocab, generator=g) * logit_std
    context = torch.randint(n_contexts, (n_sequences, length), generator=g)
    actions = torch.multinomial(logits[context].softmax(-1).flatten(0, 1), 1, generator=g).view(n_sequences, length)
    a = torch.randn(n_sequences, generator=g)
    a = (a - a.mean()) / a.std()
    batch = {"logits": logits, "context": context, "actions": actions, "advantages": a[:, None].expand(-1, length).clone()}
    batch["old_logp"] = _logp(logits, batch)
    return batch


def surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, *, clip_low: float, clip_high: float,
              ratio: str = "old") -> tuple[torch.Tensor, torch.Tensor]:
    """Token-mean PPO loss −min(ρA, clip(ρ, 1 − ε_low, 1 + ε_high)A) and the ratio it used.

    ``ratio="old"`` (fix): ρ = exp(logp − old_logp). ``ratio="detached"`` (bug): ρ = exp(logp − logp.detach()), 1 in
    value at any parameters, gradient ∇logp."""
    if ratio not in RATIOS:
        raise ValueError(f"ratio must be one of {list(RATIOS)}, got {ratio!r}")
    rho = torch.exp(logp - (logp.detach() if ratio == "detached" else old_logp))
    per_token = torch.maximum(-advantages * rho, -advantages * rho.clamp(1 - clip_low, 1 + clip_high))
    return per_token.mean(), rho


def clip_fractions(rho: torch.Tensor, advantages: torch.Tensor, *, clip_low: float, clip_high: float) -> dict:
    """Shares of tokens clipped: ``high`` (ρ > 1 + ε_high and A > 0), ``low`` (ρ < 1 − ε_low and A < 0), ``gated``
    their sum — the tokens whose gradient the clip removed — and ``band``: ρ outside the band whatever A's sign."""
    rho = rho.detach()
    high = ((rho > 1 + clip_high) & (advantages > 0)).float().mean()
    low = ((rho < 1 - clip_low) & (advantages < 0)).float().mean()
    band = ((rho > 1 + clip_high) | (rho < 1 - clip_low)).float().mean()
    return {"high": float(high), "low": float(low), "gated": float(high + low), "band": float(band)}


def _logp(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """Log-prob of each position's sampled token under the tabular policy ``logits`` ``[n_contexts, vocab]``."""
    return logits.log_softmax(-1)[batch["context"]].gather(-1, batch["actions"][..., None])[..., 0]


def gradient(batch: dict, logits: torch.Tensor, *, clip_low: float, clip_high: float, ratio: str) -> torch.Tensor:
    """The surrogate's gradient with respect to the logits, at ``logits``."""
    z = logits.detach().clone().requires_grad_(True)
    loss, _ = surrogate(_logp(z, batch), batch["old_logp"], batch["advantages"], clip_low=clip_low,
                        clip_high=clip_high, ratio=ratio)
    loss.backward()
    return z.grad


def ppo_run(batch: dict, *, epochs: int, lr: float, clip_low: float, clip_high: float, ratio: str,
            with_gap: bool = True) -> dict:
    """``epochs`` full-batch Adam updates of the tabular policy on one sampled batch. Per epoch (before its update):
    the clip fractions the loss sees (its own ρ), the true ones (ρ against ``old_logp``), the true max |ρ − 1|, and the
    gradient gap 1 − cos(g_bug, g_fix) at the current parameters (0: the same direction; 1: orthogonal; NaN when
    ``with_gap`` is False). Returns the curves and the final logits."""
    z = batch["logits"].clone().requires_grad_(True)
    first, second = torch.zeros_like(z), torch.zeros_like(z)  # Adam's moments, written out: torch.optim's first step
    beta1, beta2 = 0.9, 0.999                                   # imports torch._dynamo (over a CPU-second)
    curves = {k: [] for k in ("seen_gated", "true_gated", "true_band", "true_high", "true_low", "max_deviation", "gradient_gap")}
    for _ in range(epochs):
        logp = _logp(z, batch)
        loss, rho = surrogate(logp, batch["old_logp"], batch["advantages"], clip_low=clip_low, clip_high=clip_high, ratio=ratio)
        true_rho = torch.exp(logp.detach() - batch["old_logp"])
        seen = clip_fractions(rho, batch["advantages"], clip_low=clip_low, clip_high=clip_high)
        true = clip_fractions(true_rho, batch["advantages"], clip_low=clip_low, clip_high=clip_high)
        curves["seen_gated"].append(seen["gated"])
        for k in ("gated", "band", "high", "low"):
            curves[f"true_{k}"].append(true[k])
        curves["max_deviation"].append(float((true_rho - 1).abs().max()))
        if with_gap:
            grads = {r: gradient(batch, z, clip_low=clip_low, clip_high=clip_high, ratio=r) for r in RATIOS}
            cosine = torch.nn.functional.cosine_similarity(grads["detached"].flatten(), grads["old"].flatten(), dim=0, eps=1e-30)
            curves["gradient_gap"].append(max(0.0, float(1 - cosine)))  # cos ≤ 1: a negative value is float rounding
        else:
            curves["gradient_gap"].append(float("nan"))
        (grad,) = torch.autograd.grad(loss, z)
        with torch.no_grad():
            step = len(curves["seen_gated"])
            first.mul_(beta1).add_(grad, alpha=1 - beta1)
            second.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            z -= lr * (first / (1 - beta1**step)) / ((second / (1 - beta2**step)).sqrt() + 1e-8)
    return {"curves": curves, "logits": z.detach()}


# ---- sweeps --------------------------------------------------------------------------------------
def seed_runs(seeds, *, n_sequences: int, length: int, vocab: int, n_contexts: int = 32, epochs: int, lr: float, clip_low: float,
              clip_high: float) -> list[dict]:
    """For each seed's batch: both ratios at ε_high = ``clip_high`` and at ε_high = ε_low, the largest logit
    difference between the two ε_high runs of each ratio (0: the clip-higher setting did nothing), and the curves."""
    out, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)  # operations this small only spin a second thread (10× the CPU time on a shared machine)
    try:
        for seed in seeds:
            batch = tabular_batch(n_sequences, length, vocab, n_contexts=n_contexts, seed=seed)
            row = {"seed": seed}
            for ratio in RATIOS:
                asym = ppo_run(batch, epochs=epochs, lr=lr, clip_low=clip_low, clip_high=clip_high, ratio=ratio,
                               with_gap=ratio == "old")
                sym = ppo_run(batch, epochs=epochs, lr=lr, clip_low=clip_low, clip_high=clip_low, ratio=ratio, with_gap=False)
                row[ratio] = {**asym["curves"], "clip_higher_effect": float((asym["logits"] - sym["logits"]).abs().max())}
            out.append(row)
    finally:
        torch.set_num_threads(threads)
    return out


def headline(rows: list[dict]) -> dict:
    """Across seeds, at the last epoch: the true gated clip fraction and max |ρ − 1| of each ratio, the fraction the
    bug's loss sees, the gradient gap (mean ± s.e.), the ungated over-count of the fix, and the clip-higher effect."""
    n = len(rows)

    def mean_se(values):
        t = torch.tensor(values, dtype=torch.float64)
        return float(t.mean()), float(t.std() / n**0.5) if n > 1 else 0.0

    gap = mean_se([max(r["old"]["gradient_gap"]) for r in rows])
    return {
        "seeds": n, "epochs": len(rows[0]["old"]["seen_gated"]),
        "bug_seen_clip": max(max(r["detached"]["seen_gated"]) for r in rows),
        "bug_true_clip": mean_se([r["detached"]["true_gated"][-1] for r in rows])[0],
        "fix_clip": mean_se([r["old"]["seen_gated"][-1] for r in rows])[0],
        "fix_band": mean_se([r["old"]["true_band"][-1] for r in rows])[0],
        "bug_max_deviation": mean_se([r["detached"]["max_deviation"][-1] for r in rows])[0],
        "fix_max_deviation": mean_se([r["old"]["max_deviation"][-1] for r in rows])[0],
        "gradient_gap": gap[0], "gradient_gap_se": gap[1],
        "first_epoch_gap": max(r["old"]["gradient_gap"][0] for r in rows),
        "bug_clip_higher_effect": max(r["detached"]["clip_higher_effect"] for r in rows),
        "fix_clip_higher_effect": min(r["old"]["clip_higher_effect"] for r in rows),
        "fix_seen_equals_true": all(r["old"]["seen_gated"] == r["old"]["true_gated"] for r in rows),
    }


# ---- verdict -------------------------------------------------------------------------------------
def verdict(head: dict, *, threshold: float = 0.05, tolerance: float = 1e-6) -> tuple[bool, bool]:
    """(reproduced, fixed) from ``headline``.

    Reproduced: the bug's loss never sees a clipped token although its true ratio leaves the band (true gated clip
    fraction > 0), ε_high leaves its trajectory bit-identical, and its gradient's direction differs from the correct
    one's by more than ``threshold`` (1 − cos) at some epoch. Fixed: the fix's loss sees exactly the true clip
    fraction, at the first epoch (θ = θ_old) both gradients agree within ``tolerance``, and where tokens were clipped
    ε_high changes the trajectory.
    """
    reproduced = (head["bug_seen_clip"] == 0 and head["bug_true_clip"] > 0 and head["bug_clip_higher_effect"] == 0
                  and head["gradient_gap"] > threshold)
    fixed = (head["fix_seen_equals_true"] and head["first_epoch_gap"] <= tolerance
             and (head["fix_clip"] == 0 or head["fix_clip_higher_effect"] > 0))
    return bool(reproduced), bool(fixed)


# ---- figures -------------------------------------------------------------------------------------
def _mean_curve(rows: list[dict], ratio: str, key: str) -> list[float]:
    return torch.tensor([r[ratio][key] for r in rows]).mean(0).tolist()


def plot_clip_fraction(ax, rows: list[dict]) -> None:
    """Per epoch, the clip fraction each loss sees (mean over seeds), and the fix's ungated count."""
    x = range(1, len(rows[0]["old"]["seen_gated"]) + 1)
    ax.plot(x, _mean_curve(rows, "detached", "seen_gated"), "o-", color=plots.BUG_COLOR, label="seen, detached ρ (bug)")
    ax.plot(x, _mean_curve(rows, "detached", "true_gated"), "o:", color=plots.BUG_COLOR, label="true, bug's run")
    ax.plot(x, _mean_curve(rows, "old", "seen_gated"), "s-", color=plots.FIX_COLOR, label="seen = true, old_lp (fix)")
    ax.plot(x, _mean_curve(rows, "old", "true_band"), "^--", color=plots.NEUTRAL_COLOR, label="fix, counted ungated")
    ax.set_xlabel("PPO epoch")
    ax.set_ylabel("clip fraction")
    plots.integer_axis(ax.xaxis)
    plots.note_coinciding(ax, legend_kw=plots.legend_outside(ax))


def plot_gradient_gap(ax, rows: list[dict]) -> None:
    """Per epoch of the fix's run, 1 − cos(g_detached, g_old) at the same parameters (each seed, and the mean)."""
    x = list(range(1, len(rows[0]["old"]["gradient_gap"]) + 1))
    for r in rows:
        ax.plot(x, r["old"]["gradient_gap"], "-", color=plots.BUG_COLOR, alpha=0.3, lw=1)
    ax.plot(x, _mean_curve(rows, "old", "gradient_gap"), "o-", color=plots.BUG_COLOR, label="detached vs old_lp")
    ax.set_xlabel("PPO epoch")
    ax.set_ylabel("1 − cos(g_bug, g_fix)")
    plots.integer_axis(ax.xaxis)
    ax.legend(**plots.legend_outside(ax))


def plot_deviation(ax, rows: list[dict], clip_high: float) -> None:
    """Per epoch, the true max |ρ − 1| of each run (mean over seeds), against ε_high."""
    x = range(1, len(rows[0]["old"]["max_deviation"]) + 1)
    ax.plot(x, _mean_curve(rows, "detached", "max_deviation"), "o-", color=plots.BUG_COLOR, label=RATIOS["detached"])
    ax.plot(x, _mean_curve(rows, "old", "max_deviation"), "s-", color=plots.FIX_COLOR, label=RATIOS["old"])
    ax.axhline(clip_high, color=plots.NEUTRAL_COLOR, ls=":", label="ε_high")
    ax.set_xlabel("PPO epoch")
    ax.set_ylabel("true max |ρ − 1|")
    plots.integer_axis(ax.xaxis)
    plots.note_coinciding(ax, legend_kw=plots.legend_outside(ax))


def plot_clip_higher_effect(ax, rows: list[dict]) -> None:
    """Per seed, the largest logit difference between the ε_high = ε_low and the asymmetric run (0 = a no-op)."""
    x = range(len(rows))
    width = 0.38
    for k, ratio in enumerate(RATIOS):
        bars = ax.bar([i + (k - 0.5) * width for i in x], [r[ratio]["clip_higher_effect"] for r in rows], width,
                      color=plots.bug_fix_color(ratio == "detached"), label=RATIOS[ratio])
        plots.label_zero_bars(ax, bars)
    ax.set_xticks(list(x), [f"seed {r['seed']}" for r in rows])
    ax.set_ylabel("max |Δ logit|, ε_high on/off")
    ax.legend(**plots.legend_outside(ax))


def figure_clip_higher(rows: list[dict], clip_high: float):
    fig, axes = plots.panel_grid(4, panel_height=3.7)
    plot_clip_fraction(axes[0], rows)
    plot_gradient_gap(axes[1], rows)
    plot_deviation(axes[2], rows, clip_high)
    plot_clip_higher_effect(axes[3], rows)
    fig.tight_layout()
    return fig


# ---- printers ------------------------------------------------------------------------------------
def epoch_lines(rows: list[dict]) -> str:
    """Per epoch, means over seeds: clip fractions (seen/true) of both runs and the gradient gap."""
    lines = []
    for e in range(len(rows[0]["old"]["seen_gated"])):
        m = {(r, k): sum(row[r][k][e] for row in rows) / len(rows)
             for r in RATIOS for k in ("seen_gated", "true_gated", "true_band", "max_deviation")}
        gap = sum(row["old"]["gradient_gap"][e] for row in rows) / len(rows)
        lines.append(f"epoch {e + 1}: bug sees {m['detached', 'seen_gated']:.3f} clipped (true {m['detached', 'true_gated']:.3f}, "
                     f"max|ρ−1| {m['detached', 'max_deviation']:.3f}); fix {m['old', 'seen_gated']:.3f} (ungated count "
                     f"{m['old', 'true_band']:.3f}, max|ρ−1| {m['old', 'max_deviation']:.3f}); gradient gap {gap:.3f}")
    return "\n".join(lines)


def headline_sentence(head: dict) -> str:
    reproduced, fixed = verdict(head)
    return (f"After {head['epochs']} epochs ({head['seeds']} seeds): the detached ratio's loss saw {head['bug_seen_clip']:.0%} of "
            f"tokens clipped while its true ratio had {head['bug_true_clip']:.1%} past the clip (max |ρ − 1| "
            f"{head['bug_max_deviation']:.2f} vs the fix's {head['fix_max_deviation']:.2f}); its gradient differs from the "
            f"correct one by up to 1 − cos = {head['gradient_gap']:.3f} ± {head['gradient_gap_se']:.3f} (mean ± s.e. over seeds "
            f"of each seed's largest gap); ε_high moved its logits by {head['bug_clip_higher_effect']:.1g} (the fix's: "
            f"{head['fix_clip_higher_effect']:.2g}). The ungated count reports {head['fix_band']:.1%} clipped where "
            f"{head['fix_clip']:.1%} were. " + ("Reproduced" if reproduced else "Not reproduced")
            + ("; the fix sees the true clip fraction." if fixed else "; the fix does NOT behave as expected."))


def clip_higher_note(n_sequences: int, length: int, vocab: int, n_contexts: int, lr: float, clip_low: float, clip_high: float) -> str:
    return (f"A tabular softmax policy ({n_sequences} sequences × {length} tokens over {n_contexts} contexts, vocabulary "
            f"{vocab}), one sampled batch "
            f"trained by full-batch Adam (lr {lr:g}), ε_low {clip_low:g}, ε_high {clip_high:g}; curves are means over seeds. "
            "Top left: clip fraction the loss sees (bug: its own ρ ≡ 1), the true one, and the fix's count when not gated "
            "by the advantage's sign. Top right: 1 − cosine between the detached and the correct gradient at the fix's "
            "parameters (thin: seeds). Bottom left: true max |ρ − 1|. Bottom right: how far ε_high moves the final logits.")


# ---- explorer ------------------------------------------------------------------------------------
def clip_explorer(n_sequences: int = 16, length: int = 8, vocab: int = 16, epochs: int = 6, seed: int = 0) -> Explorer:
    """Sliders for the learning rate and ε_high: the clip fractions per epoch, detached ratio vs stored old log-probs."""

    def draw(lr, clip_high):
        rows = seed_runs([seed], n_sequences=n_sequences, length=length, vocab=vocab, epochs=epochs, lr=lr, clip_low=0.2,
                         clip_high=clip_high)
        fig, ax = plt.subplots(figsize=(6, 4))
        plot_clip_fraction(ax, rows)
        fig.tight_layout()
        return headline(rows)

    controls = {"lr": widgets.FloatLogSlider(value=0.05, base=10, min=-2.5, max=-0.5, description="Adam lr"),
                "clip_high": widgets.FloatSlider(value=0.28, min=0.2, max=0.5, step=0.02, description="ε_high")}
    return Explorer(controls, draw, title="P46: clip-higher with a detached ratio")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(rows: list[dict], head: dict, settings: dict) -> dict:
    reproduced, fixed = verdict(head)
    return dict(
        notebook="46_clip_higher_noop", reproduced=reproduced, fixed=fixed,
        metrics={"headline": head, "by_seed": rows, "settings": settings},
        headline={"what": f"clip fraction the loss sees after {head['epochs']} PPO epochs", "unit": "share of tokens",
                  "bug": head["bug_seen_clip"], "fix": head["fix_clip"]},
    )
