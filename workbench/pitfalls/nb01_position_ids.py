"""Pitfall S1: left padding without explicit position ids.

A Hugging Face causal LM given only ``input_ids`` and ``attention_mask`` numbers positions
0..T−1 whatever the padding, so a left-padded row's real tokens sit at positions shifted by its
pad count. With rotary embeddings (Llama, Qwen2) attention only sees position *differences*, so
the shift cancels up to float rounding; with learned absolute positions (GPT-2) every token gets
a different position vector and the logits change.

``logprob_drift`` measures it: the largest |Δ log p(token)| between each text scored alone
(no padding, the reference) and the same text in a padded batch.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
import torch

from workbench.core.batching import pad_sequences
from workbench.experiments import statistics
from workbench.experiments.checkpoints import load
from workbench.modeling.models import uses_rope
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import response_logprobs, token_logprobs
from workbench.modeling.tiny import ARCHITECTURES, tiny_model
from workbench.tasks import encode_prompts
from workbench.viz import plots
from workbench.viz.explorer import Explorer
from workbench.viz.plots import draw_floor

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
FLOAT_ROUNDING = 1e-4  # nats: a drift at most this large is float rounding (fp32 measures ~5e-7), the verdict's tolerance
PPO_VARIANTS = {"position_ids=model (bug)": {"position_ids": "model"}, "position_ids=mask (fix)": {"position_ids": "mask"}}


# ---- measurements -------------------------------------------------------------------------------
@torch.no_grad()
def logprobs_alone(model, rows: list[list[int]]) -> list[torch.Tensor]:
    """Per-token log-probs of each row scored on its own (batch of one, no padding)."""
    out = []
    for row in rows:
        ids = torch.tensor([row], device=model.device)
        out.append(token_logprobs(model, ids, torch.ones_like(ids), position_ids="mask")[0].float())
    return out


@torch.no_grad()
def logprobs_padded(model, rows: list[list[int]], *, pad_token_id: int, side: str, extra_pad: int, position_ids: str) -> list[torch.Tensor]:
    """Per-token log-probs of each row's real tokens when scored in one padded batch.

    ``extra_pad`` pads every row by that many more tokens than the longest row needs.
    """
    width = max(len(r) for r in rows) + extra_pad
    ids, mask = pad_sequences(rows, pad_token_id, side=side, length=width)
    ids, mask = ids.to(model.device), mask.to(model.device)
    logprobs = token_logprobs(model, ids, mask, position_ids=position_ids).float()
    out = []
    for i, row in enumerate(rows):
        n = len(row)
        start = width - n if side == "left" else 0
        # target t (t ≥ 1) of the row sits at column start + t, i.e. logprob index start + t − 1
        out.append(logprobs[i, start : start + n - 1])
    return out


def per_text_drift(model, rows, *, pad_token_id: int, extra_pad: int, position_ids: str, side: str = "left") -> list[float]:
    """max |Δ log p| of each row, padded (``side``, ``extra_pad``) vs alone (0 for a row with no target)."""
    alone = logprobs_alone(model, rows)
    padded = logprobs_padded(model, rows, pad_token_id=pad_token_id, side=side, extra_pad=extra_pad, position_ids=position_ids)
    return [float((a - p).abs().max()) if len(a) else 0.0 for a, p in zip(alone, padded, strict=True)]


def logprob_drift(
    model, rows: list[list[int]], *, pad_token_id: int, side: str = "left", extra_pad: int = 0, position_ids: str = "model"
) -> float:
    """max |log p_padded − log p_alone| over every real token of every row: the largest ``per_text_drift``."""
    return max(per_text_drift(model, rows, pad_token_id=pad_token_id, extra_pad=extra_pad, position_ids=position_ids, side=side))


def drift_table(model, rows, *, pad_token_id: int, extra_pads=(0, 4, 16), sides=("left", "right")) -> list[dict]:
    """Drift for every side × pad length × position-ids mode: rows of a tidy table."""
    table = []
    for side in sides:
        for extra_pad in extra_pads:
            for mode in ("model", "mask"):
                drift = logprob_drift(model, rows, pad_token_id=pad_token_id, side=side, extra_pad=extra_pad, position_ids=mode)
                table.append({"side": side, "extra_pad": extra_pad, "position_ids": mode, "max_abs_dlogp": drift})
    return table


@torch.no_grad()
def first_step_mismatch(model, tokenizer, prompts: list[str], *, position_ids: str, max_new_tokens: int = 8, seed: int = 0) -> dict:
    """What S1 does to PPO before any update.

    Responses are sampled with mask-derived positions (as ``generate`` does) and their log-probs
    recorded; the training forward then rescores them with ``position_ids``. With a reference
    model identical to the policy, the importance ratio ρ = exp(logp_train − logp_rollout) should
    be exactly 1 and the per-token KL estimate (k1 = logp_rollout − logp_ref) exactly 0.
    """
    ids, mask = encode_prompts(tokenizer, prompts)
    rollout = sample(
        model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed),
    )
    train_logp = response_logprobs(model, ids, mask, rollout.response_ids, rollout.response_mask, position_ids=position_ids)
    # k1 per token against a reference with the policy's own weights; its negative is log ρ
    kl_k1 = rollout.rollout_logprobs - train_logp
    real = kl_k1[rollout.response_mask.bool()]
    return {
        "max_ratio_deviation": float(((-real).exp() - 1).abs().max()),
        "mean_abs_kl_k1": float(real.abs().mean()),
        "sequence_kl_k1": float((kl_k1 * rollout.response_mask).sum(-1).mean()),
        "max_abs_logp_gap": float(real.abs().max()),
    }


# ---- sweeps -------------------------------------------------------------------------------------
def drift_sweep(texts: list[str], pad_lengths, *, seed: int = 0, architectures=None, dtypes=("fp32", "bf16")) -> dict:
    """``drift_table`` for every tiny architecture × dtype: ``{(arch, dtype, side, mode): [drift per pad length]}``."""
    sweep = {}
    for arch in architectures or ARCHITECTURES:
        for dtype in dtypes:
            model, tokenizer = tiny_model(arch, seed=seed, dtype=DTYPES[dtype])
            rows = [tokenizer(t)["input_ids"] for t in texts]
            for r in drift_table(model, rows, pad_token_id=tokenizer.pad_token_id, extra_pads=tuple(pad_lengths)):
                sweep.setdefault((arch, dtype, r["side"], r["position_ids"]), []).append(r["max_abs_dlogp"])
    return sweep


def first_step_table(names, prompts: list[str], *, seed: int = 0, device: str = "auto", pad_token: str | None = "auto") -> dict:
    """``first_step_mismatch`` for each model name × position-ids mode: ``{(name, mode): result}``
    (``device``, ``pad_token``: as for ``workbench.experiments.checkpoints.load``)."""
    table = {}
    for name in names:
        model, tokenizer = load(name, device=device, pad_token=pad_token)
        for mode in ("model", "mask"):
            table[name, mode] = first_step_mismatch(model, tokenizer, prompts, position_ids=mode, seed=seed)
    return table


def worst(sweep: dict, arch: str, dtype: str = "fp32", mode: str = "model", sides=("left", "right")) -> float:
    """The largest drift over pad lengths and ``sides`` of one architecture, dtype and mode."""
    return max(max(sweep[arch, dtype, side, mode]) for side in sides)


def bf16_rope_drift(sweep: dict, rope=("llama", "qwen2")) -> tuple[float, float]:
    """Largest left-padding drift of the rotary models in bf16 without (bug) and with (fix) position ids."""
    return (max(worst(sweep, a, "bf16", "model", ("left",)) for a in rope),
            max(worst(sweep, a, "bf16", "mask", ("left",)) for a in rope))


def ppo_effects(runs: dict) -> dict:
    """Bug vs fix effects on reward, KL and held-out accuracy (``statistics.effect``)."""
    return {key: statistics.effect(runs, key, *PPO_VARIANTS) for key in ("reward", "kl", "heldout_accuracy")}


# ---- verdict ------------------------------------------------------------------------------------
def verdict(drift_bug: float, drift_fix: float, *, threshold: float = 1e-2, tolerance: float = FLOAT_ROUNDING) -> tuple[bool, bool]:
    """(reproduced, fixed): the drift without position ids exceeds ``threshold`` nats, and with
    mask-derived position ids it is float noise (≤ ``tolerance``)."""
    return bool(drift_bug > threshold), bool(drift_fix <= tolerance)


def not_shown(model, drift_bug: float, *, threshold: float = 1e-2) -> str | None:
    """Why ``model`` cannot show S1 in this precision, or None: with rotary positions the shift
    cancels up to rounding, so the drift (or first-step |ρ − 1|) without position ids stays below ``threshold``."""
    if drift_bug > threshold or not uses_rope(model):
        return None
    return (f"{model.config.model_type} has rotary positions: the left-padding shift cancels up to rounding (largest effect "
            f"without position ids {drift_bug:.1e} ≤ {threshold:g} in {next(model.parameters()).dtype}); a checkpoint with "
            "learned absolute positions (realistic-gpt2) shows it")


# Stated before any run: position ids that do not follow the mask change the policy's log-probs of
# left-padded rows but not the reference's sampled continuation, so the logged KL to the reference is inflated.
PREDICTION = statistics.Prediction("kl", "logged KL to the reference (position ids not following the mask)", "+", "nats")


# ---- figures ------------------------------------------------------------------------------------
MODE_LABELS = {"model": "position_ids=model (bug)", "mask": "position_ids=mask (fix)"}
# (history key, panel title, y label); the gap is |Δ log p|, not |ρ − 1|: that saturates at 1 as ρ → 0
PPO_PANELS = (("reward", "reward", "mean task reward"), ("kl", "KL to the reference", "nats / response"),
              ("first_logp_gap", "sampler vs trainer", "max |Δ log p| (nats)"))


def _nonzero(values):
    return [v if v > 0 else float("nan") for v in values]


def plot_drift_per_text(ax, texts: list[str], drift: dict[str, list[float]], tolerance: float = FLOAT_ROUNDING) -> None:
    """Bars per text, bug (``model``) beside fix (``mask``), over a dotted line at ``tolerance`` (the verdict's float
    rounding: a bar under it is rounding, not a position effect); an exact 0 is written, not drawn."""
    width = 0.4
    for offset, mode in ((-width / 2, "model"), (width / 2, "mask")):
        x = [i + offset for i in range(len(texts))]
        values = drift.get(mode)
        if values is None:
            continue
        ax.bar(x, _nonzero(values), width, color=plots.bug_fix_color(mode == "model"), label=MODE_LABELS[mode])
        for xi, v in zip(x, values, strict=True):
            if v == 0:
                ax.text(xi, 1e-8, "0", ha="center", va="bottom", fontsize=8, color=plots.bug_fix_color(mode == "model"))
    ax.axhline(tolerance, color=plots.NEUTRAL_COLOR, ls=":", lw=1.2, label=f"float rounding ({tolerance:.0e})")
    ax.set_yscale("log")
    ax.set_ylim(1e-8, 10)
    ax.set_xlim(-0.5, len(texts) - 0.5)  # a text whose bars are 0 (not drawn) keeps its place
    ax.set_xticks(range(len(texts)), texts, rotation=30, fontsize=8)
    ax.set_ylabel("max |Δ log p| (nats)")
    handles, labels = ax.get_legend_handles_labels()  # the bars first, the reference line last
    plots.legend_outside(ax, "right", handles=handles[1:] + handles[:1], labels=labels[1:] + labels[:1])


def plot_drift_heatmap(ax, sweep: dict, fig=None):
    """Median over pad lengths of the drift, per architecture × dtype (rows) and side × mode (columns)."""
    archs = sorted({k[0] for k in sweep}, key=["llama", "qwen2", "gpt2"].index)
    dtypes = [d for d in DTYPES if any(k[1] == d for k in sweep)]
    columns = [(side, mode) for side in ("left", "right") for mode in ("model", "mask")]
    rows = [(a, d) for a in archs for d in dtypes]
    table = np.array([[float(np.median(sweep[a, d, s, m])) for s, m in columns] for a, d in rows])
    shown = np.where(table > 0, np.log10(np.where(table > 0, table, 1)), -9)
    image = ax.imshow(shown, cmap="magma_r", aspect="auto", vmin=-9, vmax=0)
    ax.set_xticks(range(len(columns)), [f"{s} pad\n{m}" for s, m in columns])
    ax.set_xlabel("padding side, position_ids (model = bug, mask = fix)")
    ax.set_yticks(range(len(rows)), [f"{a} {d}" for a, d in rows])
    plots.annotate_grid(ax, [["0" if v == 0 else f"{v:.0e}" for v in row] for row in table], image=image)  # by luminance
    ax.grid(False)
    if fig is not None:
        fig.colorbar(image, ax=ax, label="log10 max |Δ log p| (0 drawn at −9)")
    ax.set_title("Drift, median over pad lengths")
    return table


def plot_drift_vs_pad(axes, sweep: dict, pad_lengths) -> None:
    """One panel per dtype: left-padding drift vs pad length, per architecture, bug and fix. Exact zeros
    are drawn on a labelled dotted floor, one for both panels (their y axis is shared) at least two decades
    under the smallest non-zero value of either, so a fix series that is 0 stays a visible line and never
    sits above another panel's real drift."""
    archs = sorted({k[0] for k in sweep}, key=["llama", "qwen2", "gpt2"].index)
    floor = plots.log_floor([v for arch in archs for dtype in list(DTYPES)[:len(axes)] for mode in ("model", "mask")
                             for v in sweep[arch, dtype, "left", mode]])
    for ax, dtype in zip(axes, DTYPES, strict=False):
        for i, arch in enumerate(archs):
            for mode, bug in (("model", True), ("mask", False)):
                # fix: large hollow markers underneath, bug: small filled ones on top (they coincide for RoPE in fp32)
                ax.plot(list(pad_lengths), [max(v, floor) for v in sweep[arch, dtype, "left", mode]], plots.LINE_STYLES[i],
                        marker=plots.MARKERS[i], color=plots.bug_fix_color(bug), zorder=(6 if bug else 3) - i / 10,
                        markersize=4 if bug else 9, markerfacecolor=None if bug else "none",
                        label=f"{arch} ({'bug' if bug else 'fix'})")
        ax.set_yscale("log")
        if any(v == 0 for arch in archs for mode in ("model", "mask") for v in sweep[arch, dtype, "left", mode]):
            draw_floor(ax, floor)
        ax.set_xlabel("extra left pads per row")
        ax.set_title(f"left padding, {dtype}")
        plots.integer_axis(ax.xaxis)
    axes[0].set_ylabel("max |Δ log p| (nats)")
    handles, labels = axes[0].get_legend_handles_labels()  # one legend under both panels: the same series in each
    axes[0].figure.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, bbox_to_anchor=(0.5, 0.0))


def plot_first_step(ax, table: dict) -> None:
    """Before any update, per model and mode: max |ρ − 1| (solid bars) beside max |Δ log p| (hatched), bug vs fix
    colours. |ρ − 1| saturates at 1 as ρ → 0, so a ρ of 1e-3 and one of 1e-30 read the same: the log-prob gap shows
    the size. An exact 0 is written on its bar."""
    from matplotlib.patches import Patch  # matplotlib: only when a figure is drawn

    keys = (("max_ratio_deviation", "", "max |ρ − 1|"), ("max_abs_logp_gap", "///", "max |Δ log p| (nats)"))
    colors = [plots.bug_fix_color(mode == "model") for _, mode in table]
    for k, (key, hatch, _) in enumerate(keys):
        x = [i + (k - 0.5) * 0.4 for i in range(len(table))]
        values = [r[key] for r in table.values()]
        ax.bar(x, _nonzero(values), 0.4, color=colors, hatch=hatch, edgecolor="white", lw=0)
        for xi, v in zip(x, values, strict=True):
            ax.text(xi, v if v > 0 else 1e-8, f"{v:.0e}" if v > 0 else "0", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(table)), [f"{name}\n{mode} ({'bug' if mode == 'model' else 'fix'})" for name, mode in table],
                  fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(1e-8, 1e3)
    ax.set_ylabel("|ρ − 1|, |Δ log p|")
    ax.set_title("Sampler vs trainer before any update")
    plots.legend_outside(ax, "right", handles=[Patch(facecolor="#999999", hatch=hatch, edgecolor="white", label=label)
                                               for _, hatch, label in keys])


def figure_drift_per_text(texts: list[str], drift: dict[str, list[float]]):
    fig, ax = plt.subplots(figsize=(8, 3))
    plot_drift_per_text(ax, texts, drift)
    return fig


def figure_drift_heatmap(sweep: dict):
    fig, ax = plt.subplots(figsize=(7, 4))
    plot_drift_heatmap(ax, sweep, fig)
    return fig


def figure_drift_vs_pad(sweep: dict, pad_lengths):
    fig, axes = plots.panel_grid(2, panel_height=3.6, sharey=True)
    plot_drift_vs_pad(axes, sweep, pad_lengths)
    fig.tight_layout(rect=(0, 0.1, 1, 1))  # room for the legend under both panels
    return fig


def figure_first_step(table: dict):
    fig, ax = plt.subplots(figsize=(8.5, 3.5))
    plot_first_step(ax, table)
    fig.tight_layout()
    return fig


def plot_ppo(axes, runs: dict) -> None:
    """Reward, KL and max |Δ log p| sampler vs trainer, bands per variant (bug, fix), and held-out accuracy (4 axes),
    with one legend for the figure under the panels (``ppo_note`` says what the bands and rings are)."""
    colors = plots.bug_fix_colors(runs)
    for ax, (key, title, ylabel) in zip(axes, PPO_PANELS, strict=False):
        plots.plot_bands(ax, runs, key, ylabel, colors, log=key == "first_logp_gap")
        ax.set_ylabel(ylabel)  # the band's meaning goes to the caption
        ax.set_title(title)
        ax.get_legend().remove()
    plots.plot_heldout(axes[len(PPO_PANELS)], runs, colors)
    axes[len(PPO_PANELS)].set_ylabel("greedy accuracy")
    axes[len(PPO_PANELS)].set_xticks(range(len(runs)), [f"{'bug' if i == 0 else 'fix'}\n(start □ → end ●)"
                                                        for i in range(len(runs))])
    axes[len(PPO_PANELS)].set_title("held-out accuracy")
    handles = [line for line in axes[0].get_lines() if not line.get_label().startswith("_")]
    axes[0].figure.legend(handles, list(runs), loc="lower center", ncol=len(runs), fontsize=9, bbox_to_anchor=(0.5, 0.0))


def figure_ppo(runs: dict):
    fig, axes = plots.panel_grid(4, panel_height=3.0)
    plot_ppo(axes, runs)
    fig.tight_layout(rect=(0, 0.05, 1, 1))  # room for the legend under the panels
    return fig


# ---- printers -----------------------------------------------------------------------------------
def bf16_rope_sentence(bug: float, fix: float, factor: float = 2.0) -> str:
    """The reading of ``bf16_rope_drift``'s (bug, fix): does the position shift add anything to bf16 rounding?"""
    if bug > factor * max(fix, 1e-12):
        return (f"rotary models in bf16: {bug:.1e} without position ids vs {fix:.1e} with: "
                "the shift is visible above bf16 rounding")
    return (f"rotary models in bf16: {bug:.1e} without position ids vs {fix:.1e} with: both are bf16 rounding, "
            "the fix changes nothing measurable")


def drift_summary(sweep: dict) -> str:
    """Notebook 01's measured reading of the sweep (markdown bullets)."""
    return (f"- rotary models, fp32, no position ids: max |Δ log p| = **{max(worst(sweep, a) for a in ('llama', 'qwen2')):.1e}**\n"
            f"- {bf16_rope_sentence(*bf16_rope_drift(sweep))}\n- GPT-2, fp32, no position ids: **{worst(sweep, 'gpt2'):.2f}** nats\n"
            "- every architecture with mask-derived position ids (fp32): "
            f"**{max(worst(sweep, a, mode='mask') for a in ARCHITECTURES):.1e}**")


def drift_reading(drift: float, tolerance: float = FLOAT_ROUNDING) -> str:
    """The largest drift in words: under the float-rounding line (``tolerance``) or above it."""
    if drift == 0:
        return "largest drift exactly 0"
    side = "float rounding" if drift <= tolerance else "above float rounding"
    return f"largest drift {drift:.1e} nats ({side}: line at {tolerance:.0e})"


def drift_per_text_note(extra_pad: int, tolerance: float = FLOAT_ROUNDING) -> str:
    """The caption of ``figure_drift_per_text``."""
    return (f"Each text scored alone and inside the left-padded batch (+{extra_pad} pads per row): the largest |Δ log p| over "
            f"its tokens, log scale. Dotted line: {tolerance:.0e} nats, the float-rounding level: a bar under it is rounding, "
            "not a position effect; an exact 0 is written as 0.")


def drift_heatmap_note() -> str:
    """The caption of ``figure_drift_heatmap``."""
    return ("Each cell: the largest |Δ log p| between a text alone and inside the padded batch, over the texts, the median "
            "over the pad lengths; model = positions left to the model (bug), mask = positions from the mask (fix). "
            "Darker is larger; an exact 0 is written 0.")


def drift_vs_pad_note() -> str:
    """The caption of ``figure_drift_vs_pad``."""
    return ("Left-padded batch vs each text alone, by extra pad tokens per row (log scale): bug = position_ids=model "
            "(vermilion, small filled markers), fix = position_ids=mask (blue, hollow markers); line style and marker "
            "name the architecture. Where bug and fix coincide the hollow fix marker rings the bug's.")


def first_step_note() -> str:
    """The caption of ``figure_first_step``."""
    return ("Before any update, the sampler's log-probs against the training forward's on the same responses, per model "
            "and position_ids mode (log scale): max |ρ − 1| (solid) and max |Δ log p| (hatched). |ρ − 1| saturates at 1 as "
            "ρ → 0; the log-prob gap shows the size.")


def ppo_note(runs: dict) -> str:
    """The caption of ``figure_ppo``: what the lines, bands and rings are, for this many seeds."""
    seeds = min(len(histories) for histories in runs.values())
    spread = (f"mean over {seeds} seeds, band ± std (min–max on the log-scale sampler-vs-trainer panel)" if seeds > 1
              else "one seed, no band")
    bug, fix = runs
    return (f"bug: {bug}, fix: {fix}; {spread}. A ring marks the fix where it lies under the bug. Held-out accuracy: "
            "greedy, before (□) and after (●) training, dots: seeds.")


def first_step_lines(mismatch: dict) -> str:
    return "\n".join(f"{name:>18} position_ids={mode:5}: max |ρ−1| = {r['max_ratio_deviation']:.2e}, "
                     f"sequence KL(k1) = {r['sequence_kl_k1']:+.2e}" for (name, mode), r in mismatch.items())


# ---- explorer -----------------------------------------------------------------------------------
def position_drift_explorer(texts: list[str], seed: int = 0) -> Explorer:
    """Per-token |Δ log p| between each text alone and in a left-padded batch."""
    cache: dict = {}

    def model_for(arch, dtype):
        if (arch, dtype) not in cache:
            cache[arch, dtype] = tiny_model(arch, seed=seed, dtype=DTYPES[dtype])
        return cache[arch, dtype]

    def draw(arch, dtype, pad, position_ids):
        model, tokenizer = model_for(arch, dtype)
        rows = [tokenizer(t)["input_ids"] for t in texts]
        drift = per_text_drift(model, rows, pad_token_id=tokenizer.pad_token_id, extra_pad=pad, position_ids=position_ids)
        fig, ax = plt.subplots(figsize=(8, 3))
        plot_drift_per_text(ax, texts, {position_ids: drift})
        ax.set_title(f"{arch} {dtype}, +{pad} left pads: {drift_reading(max(drift))}", fontsize=10)
        return {"max_drift": max(drift)}

    controls = {
        "arch": widgets.Dropdown(options=list(ARCHITECTURES), value="gpt2", description="arch"),
        "dtype": widgets.ToggleButtons(options=list(DTYPES), value="fp32", description="dtype"),
        "pad": widgets.IntSlider(value=4, min=0, max=32, description="extra pads"),
        "position_ids": widgets.ToggleButtons(options=["model", "mask"], value="model", description="position_ids"),
    }
    return Explorer(controls, draw, "Logit drift: pick an architecture, dtype, pad length and the fix")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(*, sweep: dict, mismatch: dict, policy, names: tuple[str, str], runs: dict, effects: dict, settings: dict,
            task: str = "arith") -> dict:
    """Notebook 01's ``notebook_api.write_metrics`` keyword arguments; ``names`` = (the PPO policy, the rotary model)."""
    reproduced, fixed = verdict(worst(sweep, "gpt2"), max(worst(sweep, a, mode="mask") for a in ARCHITECTURES))
    return {
        "notebook": "01_position_ids", "reproduced": reproduced, "fixed": fixed,
        "not_shown": not_shown(policy, mismatch[names[0], "model"]["max_ratio_deviation"]),
        "metrics": {
            "drift_without_position_ids": {a: worst(sweep, a) for a in ARCHITECTURES},
            "drift_with_position_ids": {a: worst(sweep, a, mode="mask") for a in ARCHITECTURES},
            "drift_bf16_without_position_ids": {a: worst(sweep, a, "bf16", sides=("left",)) for a in ARCHITECTURES},
            "drift_bf16_with_position_ids": {a: worst(sweep, a, "bf16", "mask", ("left",)) for a in ARCHITECTURES},
            "first_epoch_ratio_deviation_without": {n: mismatch[n, "model"]["max_ratio_deviation"] for n in names},
            "first_epoch_ratio_deviation_with": {n: mismatch[n, "mask"]["max_ratio_deviation"] for n in names},
            "ppo_effects": {k: vars(e) for k, e in effects.items()}, "prediction": PREDICTION.record(effects, task),
            "heldout_gain": statistics.heldout_gains(runs, PPO_VARIANTS), "training_settings": settings,
        },
        "headline": {"what": "max |Δ log p|, GPT-2 fp32, padded vs alone", "unit": "nats",
                     "bug": worst(sweep, "gpt2"), "fix": worst(sweep, "gpt2", mode="mask")},
    }
