"""Pitfall P19: in bf16 a sequence's log-probs depend on the batch it is scored in.

A trainer computes π_old once over the whole rollout batch (or in the rollout engine's batches),
then recomputes π_θ in training micro-batches of another size. Each micro-batch is padded to its
own longest row and runs through kernels whose reduction order depends on the shapes: GPU matmul
tiling by the number of rows; attention split into blocks along the key axis (flash attention on
GPUs; PyTorch's CPU flash-attention kernel in blocks of ``KV_BLOCK`` = 512 keys, an online softmax
across blocks). In fp32 the reordering costs ~1e-6; in bf16, with 8 significant bits, it costs ~1e-2
nats. So at learning rate 0, where ρ = π_θ/π_old must be exactly 1, it is not: verl #6280 measured a
clip fraction of 0.046 at lr 0 when rollout and actor micro-batch sizes differed.

Which reorderings a CPU shows depends on its vector extensions (with AVX-512 a row's bf16 log-probs
move whenever the width crosses a multiple of 16; with AVX2 or scalar kernels short widths give
bit-identical rows). The key-block split does not: once the padded width passes 512 keys, a row's
keys fall into other blocks than when it is scored narrow, on every x86-64 ISA. So the batch here
holds a few prompts with a long context (``long_context_prompt``): the whole batch is padded past
512, micro-batches without a long row are not (docs/CPU_PORTABILITY.md).

The fixes: recompute π_old with the training layout (the same micro-batches, so the same shapes),
or make scoring batch-invariant (here: pad every batch to one fixed width; on GPUs also
batch-invariant kernels).
"""

from __future__ import annotations

import random

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
import torch

from workbench.core import progress
from workbench.core.batching import pad_sequences
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import token_logprobs
from workbench.viz import plots
from workbench.viz.explorer import Explorer

KV_BLOCK = 512  # keys per block of PyTorch's CPU flash attention (sdpa); the split every x86-64 ISA shares


# ---- measurements -------------------------------------------------------------------------------
def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """Prompt ids through the chat template when the tokenizer has one, else plain."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    return tokenizer(prompt, verbose=False)["input_ids"]


def long_context_prompt(prompt: str, tokenizer, *, prompt_tokens: int = KV_BLOCK + 4) -> str:
    """``prompt`` behind a filler context, so that it encodes (chat template included) to about
    ``prompt_tokens`` tokens: a long-context prompt, as RL batches mix them with short ones.

    Just past ``KV_BLOCK``: a batch holding it is padded to a width whose last block starts inside
    the short rows too, so their keys straddle the block boundary (far past it they would not)."""
    def text(n: int) -> str:
        return "Context:" + " ok" * n + "\n\nQuestion: " + prompt

    n = max(prompt_tokens - len(encode_prompt(tokenizer, text(0))), 0)
    while n and len(encode_prompt(tokenizer, text(n))) > prompt_tokens:
        n -= 1
    return text(n)


def mixed_prompts(prompts: list[str], tokenizer, *, long_prompts: int, prompt_tokens: int = KV_BLOCK + 4) -> list[str]:
    """``prompts`` with ``long_prompts`` of them (spread evenly) given a long context."""
    if not 0 <= long_prompts <= len(prompts):
        raise ValueError(f"long_prompts={long_prompts}: pass 0..{len(prompts)} (the number of prompts given a long context)")
    picked = {round(k * len(prompts) / long_prompts) for k in range(long_prompts)} if long_prompts else set()
    return [long_context_prompt(p, tokenizer, prompt_tokens=prompt_tokens) if i in picked else p for i, p in enumerate(prompts)]


def position_limit(model) -> int | None:
    """The longest row a model with learned absolute positions can score (GPT-2's ``n_positions``);
    None for rotary models, whose positions have no table to run off."""
    from workbench.audit.logprobs import absolute_positions

    if not absolute_positions(model)[0]:
        return None
    config = model.config
    return getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)


def usable_long_prompts(model, long_prompts: int) -> tuple[int, list[str]]:
    """``(long_prompts, not_shown)``: no long-context prompts (and the reason) when the model's learned
    position table ends before the CPU attention key block does, else ``long_prompts`` unchanged."""
    limit = position_limit(model)
    if long_prompts and limit is not None and limit < KV_BLOCK + 64:
        return 0, [f"the position table ends at {limit} tokens, before the CPU attention key block ({KV_BLOCK}): "
                   "no long-context prompts, so only the ISA-dependent reorderings of short widths can show"]
    return long_prompts, []


@torch.no_grad()
def sample_episodes(model, tokenizer, prompts: list[str], *, max_new_tokens: int = 16,
                    seed: int = 0) -> list[tuple[list[int], int]]:
    """``[(prompt + response ids, prompt length)]`` sampled at temperature 1 (no padding kept)."""
    pad = tokenizer.pad_token_id
    stop = model.generation_config.eos_token_id or tokenizer.eos_token_id
    rows = [encode_prompt(tokenizer, p) for p in prompts]
    ids, mask = pad_sequences(rows, pad, side="left")
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=stop, pad_token_id=pad,
                     generator=torch.Generator().manual_seed(seed))
    episodes = []
    for row, response, response_mask in zip(rows, rollout.response_ids, rollout.response_mask, strict=True):
        episodes.append((row + response[response_mask.bool()].tolist(), len(row)))
    return episodes


@torch.no_grad()
def row_logprobs(model, rows: list[list[int]], *, micro_batch_size: int, pad_token_id: int, width: int | None = None,
                 order: list[int] | None = None) -> list[torch.Tensor]:
    """log p(token t | < t) of every row, scored in micro-batches of ``micro_batch_size`` rows
    taken in ``order``, each left-padded to its longest row (or to ``width`` for every batch)."""
    order = list(range(len(rows))) if order is None else order
    if width is not None and width < max(len(r) for r in rows):
        raise ValueError(f"width={width} is shorter than the longest row ({max(len(r) for r in rows)} tokens)")
    result: list[torch.Tensor | None] = [None] * len(rows)
    for start in range(0, len(order), micro_batch_size):
        chunk = order[start : start + micro_batch_size]
        ids, mask = pad_sequences([rows[i] for i in chunk], pad_token_id, side="left", length=width)
        logprobs = token_logprobs(model, ids, mask).float()
        for j, i in enumerate(chunk):
            result[i] = logprobs[j, ids.shape[1] - len(rows[i]) :]
    return result


def layout(micro_batch_size: int, *, shuffle_seed: int | None = None, width: int | None = None) -> dict:
    """A scoring layout: rows per forward, their order (shuffled like a training epoch), fixed width."""
    return {"micro_batch_size": micro_batch_size, "shuffle_seed": shuffle_seed, "width": width}


def score_in_layout(model, episodes, spec: dict, pad_token_id: int) -> list[torch.Tensor]:
    """``row_logprobs`` of every episode scored in the ``layout`` ``spec`` (its rows shuffled by its seed)."""
    order = list(range(len(episodes)))
    if spec.get("shuffle_seed") is not None:
        random.Random(spec["shuffle_seed"]).shuffle(order)
    return row_logprobs(model, [e[0] for e in episodes], micro_batch_size=spec["micro_batch_size"],
                        pad_token_id=pad_token_id, width=spec.get("width"), order=order)


def log_ratio_statistics(old: list[torch.Tensor], new: list[torch.Tensor], episodes, clip_eps: float = 0.2) -> dict:
    """The per-token log-ratio new − old over the episodes' response tokens and what a PPO clip would make of it."""
    log_ratio = torch.cat([(n - o)[prompt_len - 1 :] for n, o, (_, prompt_len) in zip(new, old, episodes, strict=True)])
    ratio = log_ratio.exp()
    return {
        "log_ratio": log_ratio,
        "tokens": int(log_ratio.numel()),
        "max_ratio_deviation": float((ratio - 1).abs().max()),
        "mean_abs_log_ratio": float(log_ratio.abs().mean()),
        "fraction_ratio_not_one": float((log_ratio != 0).float().mean()),
        "clip_fraction": float(((ratio - 1).abs() > clip_eps).float().mean()),
    }


def ratio_at_lr0(model, episodes, *, old_layout: dict, train_layout: dict, pad_token_id: int, clip_eps: float = 0.2) -> dict:
    """π_old scored with ``old_layout``, π_θ (same weights: lr 0) with ``train_layout``: ``log_ratio_statistics``."""
    old = score_in_layout(model, episodes, old_layout, pad_token_id)
    new = score_in_layout(model, episodes, train_layout, pad_token_id)
    return log_ratio_statistics(old, new, episodes, clip_eps)


@torch.no_grad()
def width_drift(model, row: list[int], widths: list[int], pad_token_id: int) -> list[float]:
    """max |Δ log p| of one row left-padded to each width vs scored alone (batch of one)."""
    alone = row_logprobs(model, [row], micro_batch_size=1, pad_token_id=pad_token_id)[0]
    return [float((row_logprobs(model, [row], micro_batch_size=1, pad_token_id=pad_token_id, width=w)[0] - alone).abs().max())
            for w in widths]


# ---- sweeps -------------------------------------------------------------------------------------
def drift_widths(row_length: int, *, block: int = KV_BLOCK, step: int = 4) -> list[int]:
    """Padded widths for ``width_drift``: the row's own, a few just wider, then across the key block."""
    near = range(row_length, row_length + 8)
    across = range(max(block - 16, row_length + 8), max(block, row_length) + 48, step)
    return sorted(set(near) | set(across))


PRECISIONS = (("fp32", torch.float32), ("bf16", torch.bfloat16))  # in this order: the model is left in bf16


def width_drift_by_precision(model, episodes, pad_token_id: int, *, long_context: bool) -> tuple[list[int], dict]:
    """The shortest episode padded to ``drift_widths`` (up to and across the key block when ``long_context``),
    ``width_drift`` in fp32 then bf16 (the model is cast in place): ``(widths, {precision: drift per width})``."""
    row = min(episodes, key=lambda e: len(e[0]))[0]
    widths = drift_widths(len(row), block=KV_BLOCK if long_context else len(row) + 16)
    return widths, {name: width_drift(model.to(dtype), row, widths, pad_token_id) for name, dtype in PRECISIONS}


def micro_batch_sweep(model, episodes, sizes: list[int], *, pad_token_id: int, old_micro_batch_size: int | None = None,
                      seed: int = 0, desc: str = "micro-batch sizes") -> list[dict]:
    """Ratio statistics at lr 0 for π_old scored over the whole batch (once) and π_θ in shuffled
    micro-batches of each size (a progress bar ``desc`` over the sizes)."""
    old = score_in_layout(model, episodes, layout(old_micro_batch_size or len(episodes)), pad_token_id)
    stats = []
    for size in progress.track(sizes, desc, unit="size"):
        new = score_in_layout(model, episodes, layout(size, shuffle_seed=seed), pad_token_id)
        r = log_ratio_statistics(old, new, episodes)
        stats.append({k: v for k, v in r.items() if k != "log_ratio"} | {"micro_batch_size": size})
    return stats


def precision_sweeps(model, episodes, sizes: list[int], *, pad_token_id: int, seed: int = 0) -> dict:
    """``micro_batch_sweep`` in fp32 then bf16 (the model is cast in place and left in bf16)."""
    return {name: micro_batch_sweep(model.to(dtype), episodes, sizes, pad_token_id=pad_token_id, seed=seed,
                                    desc=f"micro-batch sizes, {name}") for name, dtype in PRECISIONS}


def fix_cases(model, episodes, *, train_micro_batch: int, pad_token_id: int, seed: int = 0) -> dict:
    """``log_ratio_statistics`` in bf16 for the bug (π_old over the whole batch) and the two fixes (π_old recomputed
    in the training layout; one fixed width for every batch). The first key is the bug's; the bug and the first
    fix share one scoring of π_θ in the training layout. A progress bar counts the five scorings."""
    model.to(torch.bfloat16)
    width = max(len(e[0]) for e in episodes)
    train = layout(train_micro_batch, shuffle_seed=seed)
    bar = progress.bar(5, "scoring per layout", unit="scoring")

    def scored(spec: dict) -> list[torch.Tensor]:
        logprobs = score_in_layout(model, episodes, spec, pad_token_id)
        bar.update(1)
        return logprobs

    policy = scored(train)
    cases = {"π_old over the batch (bug)": (scored(layout(len(episodes))), policy),
             "π_old in the training layout": (scored(train), policy),
             "fixed width for every batch": (scored(layout(len(episodes), width=width)),
                                             scored(layout(train_micro_batch, shuffle_seed=seed, width=width)))}
    bar.close()
    return {name: log_ratio_statistics(old, new, episodes) for name, (old, new) in cases.items()}


# ---- verdict ------------------------------------------------------------------------------------
def verdict(bug: dict, fix: dict, *, tolerance: float = 1e-6, signature: float = 1e-3) -> tuple[bool, bool]:
    """``(reproduced, fixed)``: with mismatched layouts some ratio moves past ``signature`` at lr 0;
    with the fix every ratio is 1 within ``tolerance``."""
    return bug["max_ratio_deviation"] > signature, fix["max_ratio_deviation"] <= tolerance


# ---- figures ------------------------------------------------------------------------------------
DTYPE_COLORS = {"bf16": plots.SERIES_COLORS[2], "fp32": plots.SERIES_COLORS[7]}  # precisions, not bug/fix: the fix is the layout


def plot_width_drift(ax, widths: list[int], drift: dict) -> None:
    for name in ("bf16", "fp32"):
        ax.plot(widths, drift[name], color=DTYPE_COLORS[name], marker=".", label=name)
    ax.set_yscale("symlog", linthresh=1e-7)
    ax.set_ylim(bottom=0)
    ax.set(xlabel="padded width of the batch (tokens)", ylabel="max |Δ log p| vs scored alone (nats)")
    ax.legend()


def figure_width_drift(widths: list[int], drift: dict):
    fig, ax = plt.subplots(figsize=(8, 3.4))
    plot_width_drift(ax, widths, drift)
    return fig


def plot_micro_batch_sweep(axes, sizes: list[int], sweeps: dict) -> None:
    """max |ρ − 1| (left) and the share of tokens with ρ ≠ 1 (right) at lr 0 per training micro-batch size."""
    for name in ("bf16", "fp32"):
        axes[0].plot(sizes, [s["max_ratio_deviation"] for s in sweeps[name]], marker="o", color=DTYPE_COLORS[name], label=name)
        axes[1].plot(sizes, [100 * s["fraction_ratio_not_one"] for s in sweeps[name]], marker="o", color=DTYPE_COLORS[name], label=name)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(size) for size in sizes])
        ax.minorticks_off()
        ax.set_xlabel("training micro-batch size")
    axes[0].set_ylabel("max |ρ − 1| at lr 0")
    axes[0].set_yscale("symlog", linthresh=1e-7)
    axes[0].set_ylim(bottom=0)
    axes[1].set_ylabel("tokens with ρ ≠ 1 (%)")
    plots.legend_outside(axes[0], ncol=2)


def figure_micro_batch_sweep(sizes: list[int], sweeps: dict):
    fig, axes = plots.panel_grid(2, panel_height=3.6)
    plot_micro_batch_sweep(axes, sizes, sweeps)
    fig.tight_layout()
    return fig


def plot_log_ratio(ax, name: str, result: dict) -> None:
    """Histogram of one case's per-token log ρ at lr 0 (a spike at 0 when the layouts match); a log count axis only
    where the counts span ≥ 8×."""
    values = result["log_ratio"].float().numpy()
    spread = max(float(np.abs(values).max()) if values.size else 0.0, 1e-3)
    counts, _, _ = ax.hist(values, bins=60, range=(-spread, spread), color=plots.bug_fix_color("(bug)" in name))
    seen = counts[counts > 0]
    if seen.size and seen.max() >= 8 * seen.min():
        ax.set_yscale("log")
    if values.size and not np.abs(values).max():
        ax.text(0.02, 0.92, "every token: log ρ = 0 exactly", transform=ax.transAxes, fontsize=9, va="top")
    ax.set(xlabel="log ρ per response token at lr 0 (nats)", ylabel="tokens", title=name)


# ---- printers -----------------------------------------------------------------------------------
def episodes_line(episodes, model) -> str:
    lengths = [len(e[0]) for e in episodes]
    return f"{len(episodes)} episodes of {min(lengths)}–{max(lengths)} tokens, weights in {next(model.parameters()).dtype}"


def width_drift_line(drift: dict) -> str:
    return f"max drift over widths: bf16 {max(drift['bf16']):.2e}, fp32 {max(drift['fp32']):.2e} nats"


def precision_note(bf16: dict, fp32: dict) -> str:
    """One sentence comparing a bf16 and an fp32 sweep entry; explains why fp32 can count more ρ ≠ 1
    tokens (it keeps tiny differences that bf16's 8-significant-bit log-probs round away)."""
    line = (f"micro-batch {bf16['micro_batch_size']}: tokens with ρ ≠ 1: bf16 {bf16['fraction_ratio_not_one']:.1%}, "
            f"fp32 {fp32['fraction_ratio_not_one']:.1%}; max |ρ − 1|: bf16 {bf16['max_ratio_deviation']:.2e}, "
            f"fp32 {fp32['max_ratio_deviation']:.2e}")
    if fp32["fraction_ratio_not_one"] > bf16["fraction_ratio_not_one"]:
        line += (f"\nfp32 counts more tokens with ρ ≠ 1 but its deviations stay ≤ {fp32['max_ratio_deviation']:.0e}: it keeps "
                 "differences that bf16, whose log-probs sit on a grid of 8 significant bits, rounds to the same value")
    return line


def sweep_note(sweeps: dict, sizes: list[int], train_micro_batch: int) -> str:
    """``precision_note`` at the training micro-batch (the largest size when it was not swept)."""
    at = {k: v[sizes.index(train_micro_batch) if train_micro_batch in sizes else -1] for k, v in sweeps.items()}
    return precision_note(at["bf16"], at["fp32"])


def clip_note(bug: dict, clip_eps: float = 0.2) -> str:
    """Whether the layout noise moved any ratio out of PPO's clip range (chosen by the measured clip fraction)."""
    if bug["clip_fraction"] > 0:
        return (f"{bug['clip_fraction']:.1%} of the ratios leave the clip range ε = {clip_eps}: "
                "the noise changes PPO's clipped update")
    return (f"every ratio stays inside the clip range (max |ρ − 1| {bug['max_ratio_deviation']:.1e} < ε = {clip_eps}): "
            "here the layout noise biases the ratio and the KL estimate but clips nothing")


def ratio_lines(ratios: dict) -> str:
    """One line per case, then whether the bug's noise leaves PPO's clip range (``clip_note``)."""
    lines = [f"{name:30s} max |ρ−1| {r['max_ratio_deviation']:.2e}, tokens with ρ ≠ 1 {r['fraction_ratio_not_one']:.1%}, "
             f"clipped at ε = 0.2: {r['clip_fraction']:.1%}" for name, r in ratios.items()]
    return "\n".join([*lines, clip_note(next(iter(ratios.values())))])


# ---- explorer -----------------------------------------------------------------------------------
def layout_log_ratio_explorer(ratios: dict) -> Explorer:
    """P19: the per-token log-ratio at lr 0 of each scoring layout (bug, and the two fixes)."""

    def draw(case):
        fig, ax = plt.subplots(figsize=(8, 3.2))
        plot_log_ratio(ax, case, ratios[case])
        return {k: v for k, v in ratios[case].items() if k != "log_ratio"}

    return Explorer({"case": widgets.ToggleButtons(options=list(ratios), description="π_old")}, draw,
                    "P19: log ρ at lr 0 per scoring layout")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(*, drift: dict, sweeps: dict, ratios: dict, train_micro_batch: int, not_shown: list[str]) -> dict:
    """Notebook 19's ``notebook_api.write_metrics`` keyword arguments. ``ratios``: ``fix_cases`` (bug first);
    fixed needs both fixes; ``not_shown`` gains a reason when the layouts barely move this checkpoint's log-probs."""
    bug, layout_fix, width_fix = ratios.values()
    reproduced, fixed = verdict(bug, layout_fix)
    return {
        "notebook": "19_batch_shape_logprobs", "reproduced": reproduced, "fixed": fixed and verdict(bug, width_fix)[1],
        "not_shown": not_shown + ([] if reproduced else [
            f"bf16 log-probs of this checkpoint barely move with the scoring layout here "
            f"(max |ρ − 1| at lr 0 = {bug['max_ratio_deviation']:.2g}, under the verdict's threshold)"]),
        "metrics": {"width_drift_max": {k: max(v) for k, v in drift.items()}, "micro_batch_sweep": sweeps,
                    "ratio_at_lr0": {n: {k: v for k, v in r.items() if k != "log_ratio"} for n, r in ratios.items()}},
        "headline": {"what": f"max |ρ − 1| at lr 0, bf16, training micro-batch {train_micro_batch}", "unit": "ratio deviation",
                     "bug": bug["max_ratio_deviation"], "fix": layout_fix["max_ratio_deviation"]},
    }
