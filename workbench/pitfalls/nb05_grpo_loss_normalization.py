"""Pitfall S5: how a GRPO loss is normalised over tokens and sequences.

The GRPO paper averages token losses within each sequence, then over sequences
(``seq-mean-token-mean``), as TRL's ``GRPOTrainer`` 0.14.0 and 0.15.2 did; TRL 0.16.1 takes
Σ(loss·mask)/Σmask over the whole batch (``token-mean``). They weight tokens differently:

=========================== ===================================================
mode                        gradient weight of one token of a length-L_i sequence
=========================== ===================================================
token-mean                  1 / Σ_j L_j
seq-mean-token-mean         1 / (B · L_i)            (short sequences weigh more per token)
seq-mean-token-sum          1 / B
seq-mean-token-sum-norm     1 / (B · max_len)
=========================== ===================================================

The zero-loss probe makes the difference visible in the loss *value*: with β = 0 and one
iteration the per-token loss is −A_i (ρ ≡ 1) and group advantages have zero mean, so
``seq-mean-token-mean`` gives 0 up to float rounding while ``token-mean`` gives −Σ A_i L_i / Σ L_i ≠ 0 when
lengths differ. Gradients are non-zero in every mode.
"""

from __future__ import annotations

import ipywidgets as widgets
import numpy as np
import torch

from workbench.core import losses
from workbench.core.batching import pad_sequences
from workbench.experiments import statistics
from workbench.experiments.statistics import tail_mean
from workbench.modeling.scoring import response_logprobs
from workbench.tasks import encode_prompts
from workbench.trainers.grpo import grpo_loss
from workbench.viz import plots
from workbench.viz.explorer import Explorer

ZERO_LOSS_TOLERANCE = 1e-7  # |probe loss| counted as 0: float32 rounding of a mean of order-1 advantages stays below it

# ---- measurements -------------------------------------------------------------------------------
def analytic_token_weights(lengths: list[int], mode: str, max_len: int | None = None) -> list[float]:
    """∂loss/∂(per-token loss) for one token of each sequence, from the table above."""
    canonical = losses.canonical_loss_agg(mode)
    total = sum(lengths)
    max_len = max(lengths) if max_len is None else max_len
    # verl names leave fully masked rows out of the count of sequences, TRL's grpo/dr_grpo count them
    sequences = len(lengths) if losses.counts_empty_rows(mode) else sum(1 for m in lengths if m > 0)
    weights = {
        "token-mean": lambda n: 1 / total,
        "seq-mean-token-mean": lambda n: 1 / (sequences * n),
        "seq-mean-token-sum": lambda n: 1 / sequences,
        "seq-mean-token-sum-norm": lambda n: 1 / (sequences * max_len),
    }[canonical]
    return [weights(n) if n > 0 else 0.0 for n in lengths]


def measured_token_weights(lengths: list[int], mode: str, max_len: int | None = None) -> list[float]:
    """The same weights measured by autograd through ``losses.aggregate_loss``."""
    width = max(lengths) if max_len is None else max_len
    per_token = torch.zeros(len(lengths), width, requires_grad=True)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
    losses.aggregate_loss(per_token, mask, mode, max_len=max_len).backward()
    return [float(per_token.grad[i, 0]) if n > 0 else 0.0 for i, n in enumerate(lengths)]


def token_weights(lengths: list[int], modes=losses.LOSS_AGG_MODES) -> dict:
    """The gradient weight of one token of each of ``lengths`` per mode, ``analytic`` (the table above) and ``measured``
    (autograd): ``{"lengths": lengths, "analytic": {mode: weights}, "measured": {mode: weights}}``."""
    return {"lengths": list(lengths), "analytic": {mode: analytic_token_weights(lengths, mode) for mode in modes},
            "measured": {mode: measured_token_weights(lengths, mode) for mode in modes}}


def token_weight_error(weights: dict) -> float:
    """Largest |analytic − autograd| per-token weight of a ``token_weights`` result."""
    return max(abs(a - m) for mode, analytic in weights["analytic"].items()
               for a, m in zip(analytic, weights["measured"][mode], strict=True))


def effective_kl_coefficient(lengths: list[int], beta: float, loss_agg: str) -> list[float]:
    """β as felt by each sequence's tokens when the KL is normalised per sequence but the policy
    term by ``loss_agg`` (the seed's mix): β · w_KL / w_policy, with w_KL = 1/(B·L_i)."""
    policy = analytic_token_weights(lengths, loss_agg)
    kl = analytic_token_weights(lengths, "seq-mean-token-mean")
    return [beta * k / p if p > 0 else 0.0 for k, p in zip(kl, policy, strict=True)]


def zero_loss_probe(model, tokenizer, prompt: str, completions: list[str], rewards: list[float], modes=losses.LOSS_AGG_MODES,
                    scale_rewards: str = "group", max_len: int | None = None) -> dict[str, dict]:
    """The S5 probe on a real model: one group of completions of different lengths, β = 0,
    ρ ≡ 1. Returns ``{mode: {"loss": float, "grad_norm": float}}``."""
    prompt_ids, prompt_mask = encode_prompts(tokenizer, [prompt] * len(completions))
    rows = [tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for c in completions]
    response_ids, response_mask = pad_sequences(rows, tokenizer.pad_token_id, side="right")
    advantages = losses.group_advantages(torch.tensor(rewards, dtype=torch.float32), len(completions), scale_rewards)
    results = {}
    for mode in modes:
        model.zero_grad(set_to_none=True)
        logp = response_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask)
        per_token, _ = losses.clipped_surrogate(logp, logp.detach(), advantages[:, None].expand_as(logp))
        loss = losses.aggregate_loss(per_token, response_mask, mode, max_len=max_len)
        loss.backward()
        grad_norm = torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters() if p.grad is not None))
        results[mode] = {"loss": float(loss.detach()), "grad_norm": float(grad_norm)}
    model.zero_grad(set_to_none=True)
    return results


def measured_effective_beta(lengths: list[int], beta: float, loss_agg: str, kl_aggregation: str) -> list[float]:
    """β as the GRPO trainer's own loss (``trainers.grpo.grpo_loss``) applies it to each sequence's
    tokens, measured by autograd: ∂loss/∂log π from the KL term (k1, advantages 0) divided by the
    policy term's (advantages 1, β = 0). Equal to β everywhere when both terms share one normalisation."""
    width = max(lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])

    def first_token_grad(advantage: float, kl_beta: float) -> torch.Tensor:
        logp = torch.zeros(len(lengths), width, requires_grad=True)
        loss, _ = grpo_loss(logp, logp.detach(), torch.full((len(lengths),), advantage), mask, ref_logp=torch.zeros_like(logp),
                            beta=kl_beta, loss_agg=loss_agg, kl_aggregation=kl_aggregation, kl_estimator="k1", max_len=width)
        loss.backward()
        return logp.grad[:, 0]

    kl = first_token_grad(0.0, beta)
    policy = -first_token_grad(1.0, 0.0)
    return [float(k / p) for k, p in zip(kl, policy, strict=True)]


# ---- sweeps -------------------------------------------------------------------------------------
def effective_beta_sweep(spreads, beta: float, loss_agg: str = "token-mean", short: int = 2) -> dict[str, list[list[float]]]:
    """``measured_effective_beta`` for a short and a long sequence (length ratio ``spread``) under both
    KL aggregations: ``{kl_aggregation: [[β_short, β_long] per spread]}``."""
    return {agg: [measured_effective_beta([short, short * s], beta, loss_agg, agg) for s in spreads]
            for agg in ("per_sequence", "with_loss")}


def training_summary(runs: dict, fraction: float = 0.25) -> dict:
    """Per mode, the mean reward over the first and the last ``fraction`` of steps (mean over seeds) and the
    seed-to-seed std of the last: ``{mode: {"reward_start", "reward_end", "reward_end_std_over_seeds"}}``."""
    summary = {}
    for mode, histories in runs.items():
        finals = [tail_mean(h, "reward", fraction) for h in histories]
        starts = [float(np.mean([s["reward"] for s in h[: max(1, int(len(h) * fraction))]])) for h in histories]
        summary[mode] = {"reward_start": float(np.mean(starts)), "reward_end": float(np.mean(finals)),
                         "reward_end_std_over_seeds": float(np.std(finals, ddof=1)) if len(finals) > 1 else float("nan")}
    return summary


def training_effects(runs: dict, modes: list[str]) -> dict:
    """The second mode against the first (``statistics.effect(runs, key, modes[1], modes[0])``)."""
    return {key: statistics.effect(runs, key, *modes[1::-1]) for key in ("length_incorrect", "reward", "heldout_accuracy")}


# ---- verdict ------------------------------------------------------------------------------------
def verdict(probe: dict, effective: dict, beta: float, *, tolerance: float = 1e-6) -> tuple[bool, bool]:
    """(reproduced, fixed): the token-mean probe loss is not 0 and the trainer's per-sequence KL gives
    sequences different β; the per-sequence-mean probe is 0 and the trainer's ``with_loss`` KL gives
    every token the same β (relative error ≤ ``tolerance``)."""
    spread = [b for pair in effective["per_sequence"] for b in pair]
    same = [b for pair in effective["with_loss"] for b in pair]
    reproduced = abs(probe["token-mean"]["loss"]) > 1e-4 and max(spread) / min(spread) > 1.5
    fixed = abs(probe["seq-mean-token-mean"]["loss"]) <= ZERO_LOSS_TOLERANCE and all(abs(b / beta - 1) <= tolerance for b in same)
    return bool(reproduced), bool(fixed)


# Stated before any run (Dr. GRPO, arXiv 2503.20783): under the per-response mean a long wrong answer is
# penalised less per token than under the token mean, so the length of incorrect responses grows faster. The
# "bug" side is ``modes[1]`` (the per-sequence mean), the "fix" side ``modes[0]``.
PREDICTION = statistics.Prediction("length_incorrect", "length of incorrect responses (seq-mean-token-mean vs token-mean)", "+",
                                   "tokens")


# ---- figures ------------------------------------------------------------------------------------
TRAINING_PANELS = (("reward", "reward"), ("length_correct", "length, correct (tokens)"),
                   ("length_incorrect", "length, incorrect (tokens)"))
# One colour per mode in every figure: the training comparison's bug side (``PREDICTION``: the per-sequence mean) in
# BUG_COLOR, its fix side (the token mean) in FIX_COLOR, the other two modes neutral.
MODE_COLORS = {"token-mean": plots.FIX_COLOR, "seq-mean-token-mean": plots.BUG_COLOR,
               "seq-mean-token-sum": plots.NEUTRAL_COLOR, "seq-mean-token-sum-norm": plots.SERIES_COLORS[2]}
LOG_SPAN = 8.0  # a panel whose values span less than this factor gets a linear axis from 0: a log axis would zoom on noise


def mode_color(mode: str) -> str:
    return MODE_COLORS.get(losses.canonical_loss_agg(mode), plots.NEUTRAL_COLOR)


def training_colors(modes) -> dict:
    """``modes[1]`` (the prediction's bug side) in BUG_COLOR, ``modes[0]`` in FIX_COLOR, any other mode neutral."""
    others = [plots.NEUTRAL_COLOR, plots.SERIES_COLORS[2]]
    return {mode: (plots.FIX_COLOR, plots.BUG_COLOR, *others)[i] for i, mode in enumerate(modes)}


def value_scale(ax, values) -> bool:
    """A log y-axis when the positive ``values`` span at least ``LOG_SPAN``, else a linear one from 0; True when
    they are one constant (the panel then states it instead of drawing ticks around float noise)."""
    positive = [v for v in values if v > 0]
    low, high = min(positive), max(positive)
    if high / low >= LOG_SPAN:
        ax.set_yscale("log")
    else:
        ax.set_ylim(0, high * 1.25)
    return high / low < 1 + 1e-6


def plot_token_weights(ax_token, ax_total, weights: dict) -> None:
    """Per-token (analytic lines, autograd markers) and whole-response weight by length, per mode of ``weights``
    (``token_weights``); an axis is logarithmic only where its values span ``LOG_SPAN`` or more, and a constant
    is stated in the axis title."""
    lengths = weights["lengths"]
    token_values, total_values = [], []
    for i, (mode, analytic) in enumerate(weights["analytic"].items()):
        color, style = mode_color(mode), plots.LINE_STYLES[i % len(plots.LINE_STYLES)]
        measured = weights["measured"][mode]
        total = [w * n for w, n in zip(analytic, lengths, strict=True)]
        ax_token.plot(lengths, analytic, style, color=color, label=mode, zorder=5 - i)
        ax_token.plot(lengths, measured, plots.MARKERS[i], color=color, markerfacecolor="none", markersize=8)
        ax_total.plot(lengths, total, style, marker=plots.MARKERS[i], color=color, label=mode, zorder=5 - i)
        token_values += analytic + measured
        total_values += total
    for ax, values, what in ((ax_token, token_values, "weight per token"), (ax_total, total_values, "weight per response")):
        ax.set_ylabel(what)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("response length L (tokens)")
        if value_scale(ax, values):
            ax.set_title(f"{max(values):.4g} at every length", fontsize=10)


def figure_token_weights(weights: dict):
    fig, axes = plots.panel_grid(2, panel_height=3.3)
    plot_token_weights(axes[0], axes[1], weights)
    plots.figure_legend(fig, axes[0], ncol=min(4, len(weights["analytic"])))
    return fig


def plot_effective_beta(ax, spreads, effective: dict, beta: float) -> None:
    """The β each sequence's tokens feel in the trainer's loss, per KL aggregation, vs the length ratio."""
    bug, fix = effective["per_sequence"], effective["with_loss"]
    ax.plot(spreads, [b[0] for b in bug], "o-", color=plots.BUG_COLOR, label="short, KL per sequence (bug)")
    ax.plot(spreads, [b[1] for b in bug], "s--", color=plots.BUG_COLOR, label="long, KL per sequence (bug)")
    ax.plot(spreads, [b[0] for b in fix], "D-", color=plots.FIX_COLOR, markersize=9, markerfacecolor="none",
            label="short, KL per token (fix)")
    ax.plot(spreads, [b[1] for b in fix], "x:", color=plots.FIX_COLOR, markersize=9, label="long, KL per token (fix)")
    ax.axhline(beta, color=plots.NEUTRAL_COLOR, lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("length ratio long / short")
    ax.set_ylabel("effective β per token")
    plots.legend_outside(ax, "right")


def figure_effective_beta(spreads, effective: dict, beta: float):
    fig, axes = plots.panel_grid(1, width=8.0, panel_height=3.6)
    plot_effective_beta(axes[0], spreads, effective, beta)
    fig.tight_layout()
    return fig


def plot_training_bands(axes, runs: dict, window: int) -> None:
    """Reward and the lengths of correct/incorrect responses, mean ± std over seeds per mode, and held-out accuracy
    (4 axes); modes coloured by ``training_colors``, short axis labels (``training_note`` says the rest)."""
    colors = training_colors(list(runs))
    for ax, (key, label) in zip(axes, TRAINING_PANELS, strict=False):
        plots.plot_bands(ax, runs, key, label, colors, window=window)
        ax.set_ylabel(label)
    heldout = axes[len(TRAINING_PANELS)]
    plots.plot_heldout(heldout, runs, colors)
    heldout.set_ylabel("held-out accuracy")


def figure_training_bands(runs: dict, train_steps: int):
    fig, axes = plots.panel_grid(4, panel_height=3.0)
    plot_training_bands(axes, runs, window=max(1, train_steps // 10))
    plots.figure_legend(fig, axes[0], ncol=min(4, len(runs)))
    return fig


# ---- printers -----------------------------------------------------------------------------------
def probe_lines(probe: dict, completions: list[str], rewards: list[float]) -> str:
    """The zero-loss probe per mode, with TRL's name for each mode."""
    trl = {v: k for k, v in losses.LOSS_AGG_ALIASES.items() if k != "bnpo"}
    return "\n".join([f"group {completions} (lengths with EOS {[len(c) + 1 for c in completions]}), rewards {rewards}"] + [
        f"{mode:>26} (TRL {trl.get(mode, '—'):>7}): probe loss {result['loss']:+.3e}, gradient norm {result['grad_norm']:.3f}"
        for mode, result in probe.items()])


def probe_note(probe: dict, tolerance: float = ZERO_LOSS_TOLERANCE) -> str:
    """What the probe shows, from its numbers: whether the per-sequence mean's loss is 0 up to float rounding (|loss| ≤
    ``tolerance``, as ``verdict`` asks), the token mean's loss, and whether any mode's gradient is 0."""
    per_sequence, token = probe["seq-mean-token-mean"], probe["token-mean"]
    zero = abs(per_sequence["loss"]) <= tolerance
    head = (f"seq-mean-token-mean: loss {per_sequence['loss']:+.1e}, "
            + (f"0 up to float rounding (|loss| ≤ {tolerance:g})" if zero else f"not 0 (|loss| > {tolerance:g})"))
    tail = f"token-mean: {token['loss']:+.3f}" + (" (not 0)" if abs(token["loss"]) > tolerance else "")
    norms = [r["grad_norm"] for r in probe.values()]
    grads = (f"gradient norms {min(norms):.3g}–{max(norms):.3g}: " + ("no mode's update is 0" if min(norms) > 0
                                                                       else "some mode's update is 0"))
    return f"{head}; {tail}; {grads}"


def token_weights_note(weights: dict, error: float) -> str:
    """The caption of the token-weight figure."""
    return (f"Lines: the analytic weight (the table above); hollow markers: autograd through aggregate_loss, at most "
            f"{error:.1e} apart. Right: L × the per-token weight, a whole response's pull. One response of each length "
            f"{weights['lengths']}; token-mean in blue and seq-mean-token-mean in vermilion, as in part 4.")


def effective_beta_note(effective: dict, beta: float) -> str:
    """The caption of the effective-β figure, with how far the fix's β strays from ``beta``."""
    stray = max(abs(b / beta - 1) for pair in effective["with_loss"] for b in pair)
    return (f"Grey line: β = {beta:g}. Policy term under token-mean; 'KL per sequence' is the TRL 0.16.1 mix, 'KL per "
            f"token' adds the KL to each token's loss before aggregating (kl_aggregation='with_loss'): every token's β is "
            f"{beta:g} up to a relative {stray:.1e}, the short and the long response's lines one over the other.")


def training_note(runs: dict, train_steps: int) -> str:
    """The caption of the training figure: what the lines, bands and colours are."""
    modes, seeds = list(runs), max(len(h) for h in runs.values())
    window = max(1, train_steps // 10)
    lines = plots.bands_caption(runs, window)
    colours = f"bug (vermilion): {modes[1]}, fix (blue): {modes[0]}" if len(modes) > 1 else f"mode: {modes[0]}"
    return (f"Curves: {lines}; {colours}; rings mark where one mode's line hides another's. Held-out: greedy accuracy "
            "before (□) and after (●) training"
            + (", dots: seeds." if seeds > 1 else "."))


def effective_beta_line(spreads, effective: dict) -> str:
    bug, fix = effective["per_sequence"][-1], effective["with_loss"][-1]
    return (f"length ratio {spreads[-1]}: per-sequence KL gives β {bug[0]:.3f} (short) and {bug[1]:.4f} (long); "
            f"with_loss gives {fix[0]:.4f} and {fix[1]:.4f}")


# ---- explorer -----------------------------------------------------------------------------------
def loss_mode_explorer() -> Explorer:
    """Per-token and per-response gradient weight for a loss mode and a length spread."""

    def draw(mode, longest):
        lengths = sorted({1, max(1, longest // 4), max(1, longest // 2), longest})
        weights = token_weights(lengths, [mode])
        fig, axes = plots.panel_grid(2, panel_height=3.0)
        plot_token_weights(axes[0], axes[1], weights)
        fig.suptitle(f"{mode}: lines analytic, hollow markers autograd", fontsize=10)
        fig.tight_layout()
        return {"lengths": lengths, "weights": weights["analytic"][mode]}

    controls = {
        "mode": widgets.Dropdown(options=list(losses.LOSS_AGG_MODES), value="token-mean", description="loss_agg"),
        "longest": widgets.IntSlider(value=16, min=2, max=256, description="longest L"),
    }
    return Explorer(controls, draw, "Gradient weight per token and per response")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(*, probe: dict, weight_error: float, effective: dict, beta: float, runs: dict, effects: dict, settings: dict,
            task: str) -> dict:
    """Notebook 05's ``notebook_api.write_metrics`` keyword arguments."""
    reproduced, fixed = verdict(probe, effective, beta)
    return {
        "notebook": "05_grpo_loss_normalization", "reproduced": reproduced, "fixed": fixed,
        "metrics": {"zero_loss_probe": {mode: r["loss"] for mode, r in probe.items()},
                    "zero_loss_probe_grad_norm": {mode: r["grad_norm"] for mode, r in probe.items()},
                    "token_weight_max_error": weight_error, "effective_beta": effective,
                    "training": training_summary(runs),
                    "training_effects": {k: vars(e) for k, e in effects.items()}, "prediction": PREDICTION.record(effects, task),
                    "heldout_gain": {m: vars(statistics.gain(runs, m)) for m in runs}, "training_settings": settings},
        "headline": {"what": "zero-loss probe: GRPO loss at β = 0, ρ = 1 (token-mean vs per-sequence mean)", "unit": "loss",
                     "bug": probe["token-mean"]["loss"], "fix": probe["seq-mean-token-mean"]["loss"]},
    }
