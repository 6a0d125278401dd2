"""Pitfall S2: right padding, Qwen2 + flash-attention, and padding-free batches.

After sampling, a PPO actor marks everything after EOS as padding: rows that stopped early end
in zeros, so the batch is *right*-padded. transformers 4.37.0–4.41.2 ``Qwen2Model.forward``
refused such batches with flash_attention_2 whenever ``use_cache`` was true (the config default,
so training forwards hit it too)::

    is_padding_right = attention_mask[:, -1].sum().item() != batch_size
    → ValueError("You are attempting to perform batched generation with padding_side='right' ...")

The check guarded a real hazard that is silent today: in batched *cached generation* a
right-padded row's new tokens are appended after its pads, so its continuation is predicted from
a pad position and differs from generating that row alone. Left padding (with mask-derived
position ids) is exact; for training forwards, padding-free packing avoids padding altogether.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from dataclasses import dataclass

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core import progress
from workbench.core.batching import pack_sequences, pad_sequences, padding_side_of, unpack_token_values
from workbench.core.errors import RightPaddingError
from workbench.experiments.checkpoints import load
from workbench.modeling.attention import FLASH_BACKENDS, flash_attention_status, runs_flash
from workbench.modeling.rollout import sample, truncate_after_eos
from workbench.modeling.scoring import logprobs_from_logits, token_logprobs
from workbench.tasks import encode_prompts
from workbench.viz import plots
from workbench.viz.explorer import Explorer

TRANSFORMERS_MESSAGE = (
    "You are attempting to perform batched generation with padding_side='right' this may lead to unexpected "
    "behaviour for Flash Attention version of Qwen2. Make sure to  call `tokenizer.padding_side  = 'left'` "
    "before tokenizing the input."
)


# ---- measurements -------------------------------------------------------------------------------
@dataclass
class PaddingReport:
    padding_side: str
    """``left``, ``right``, ``none`` or ``mixed`` (see ``batching.padding_side_of``)."""
    right_padded: bool
    """transformers' own test: some row's last column is padding (``mask[:, -1].sum() != B``)."""
    rows_ending_in_padding: list[int]
    would_raise_in_transformers_4_37_to_4_41: bool
    """Qwen2 + flash_attention_2 + use_cache + right padding: the old ValueError."""

    def __str__(self) -> str:
        verdict = "would raise" if self.would_raise_in_transformers_4_37_to_4_41 else "passes"
        return (f"padding={self.padding_side}, right-padded={self.right_padded} "
                f"(rows {self.rows_ending_in_padding[:8]}{'…' if len(self.rows_ending_in_padding) > 8 else ''}); "
                f"transformers 4.37–4.41 Qwen2 flash-attention check: {verdict}")


def padding_guard(
    attention_mask: torch.Tensor, *, use_cache: bool = True, attn_implementation: str = "flash_attention_2", model_type: str = "qwen2"
) -> PaddingReport:
    """Classify a batch's padding and say whether the old Qwen2 flash-attention check would fire."""
    last_column = attention_mask[:, -1]
    right_padded = bool(last_column.sum().item() != attention_mask.shape[0])
    return PaddingReport(
        padding_side=padding_side_of(attention_mask),
        right_padded=right_padded,
        rows_ending_in_padding=torch.nonzero(last_column == 0).flatten().tolist(),
        would_raise_in_transformers_4_37_to_4_41=(
            right_padded and use_cache and attn_implementation == "flash_attention_2" and model_type == "qwen2"
        ),
    )


def assert_not_right_padded(attention_mask: torch.Tensor, *, use_cache: bool = True) -> None:
    """Raise ``RightPaddingError`` on a right-padded batch when a cache is in use (drop-in assertion)."""
    report = padding_guard(attention_mask, use_cache=use_cache)
    if report.right_padded and use_cache:
        raise RightPaddingError(
            f"{TRANSFORMERS_MESSAGE} ({report}). Left-pad prompts for generation, or score with use_cache=False "
            "(or padding-free packed batches) for training forwards."
        )


@torch.no_grad()
def greedy_continuations(model, tokenizer, prompts: list[str], *, side: str, max_new_tokens: int) -> list[list[int]]:
    """Greedy, cached, batched ``generate`` with prompts padded on ``side``; continuations cut after EOS."""
    rows = [tokenizer(p)["input_ids"] for p in prompts]
    ids, mask = pad_sequences(rows, tokenizer.pad_token_id, side=side)
    out = model.generate(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, use_cache=True,
    )
    continuation, keep = truncate_after_eos(out[:, ids.shape[1]:], tokenizer.eos_token_id, tokenizer.pad_token_id)
    return [row[k.bool()].tolist() for row, k in zip(continuation, keep, strict=True)]


def generation_divergence(model, tokenizer, prompts: list[str], *, max_new_tokens: int = 6) -> dict:
    """How many rows' greedy continuations differ from generating each row alone, per padding side."""
    alone = [greedy_continuations(model, tokenizer, [p], side="left", max_new_tokens=max_new_tokens)[0] for p in prompts]
    result = {"rows": len(prompts), "alone": alone}
    for side in ("left", "right"):
        batched = greedy_continuations(model, tokenizer, prompts, side=side, max_new_tokens=max_new_tokens)
        result[f"{side}_divergent_rows"] = sum(a != b for a, b in zip(alone, batched, strict=True))
        result[side] = batched
    return result


def scoring_throughput(model, sequences: list[list[int]], *, packed: bool, pad_token_id: int, repeats: int = 5) -> float:
    """Real tokens scored per second (median of ``repeats``), padded (right) or packed."""
    ids, mask = pad_sequences(sequences, pad_token_id, side="right")
    real_tokens = int(mask.sum())
    times = []
    with torch.no_grad():
        token_logprobs(model, ids, mask, packed=packed)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            token_logprobs(model, ids, mask, packed=packed)
            times.append(time.perf_counter() - start)
    return real_tokens / sorted(times)[len(times) // 2]


@torch.no_grad()
def packed_vs_alone(model, sequences: list[list[int]]) -> dict[str, float]:
    """max |Δ log p| of packed scoring vs each sequence alone: correct packing, packing with the
    cache left on, and (a term that should not exist) labels rolled across the packed row."""
    device = model.device
    alone = [logprobs_from_logits(model(input_ids=torch.tensor([s], device=device)).logits[0, :-1],
                                  torch.tensor(s[1:], device=device)) for s in sequences]
    batch = pack_sequences(sequences)
    inputs = batch.model_inputs()
    if runs_flash(model):  # boundaries given as ints (flash-attn 4: docs/GPU.md)
        inputs.update(batch.flash_varlen_kwargs())
    inputs = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in inputs.items()}
    out = {}
    for label, use_cache in (("packed", False), ("packed, cache on", True)):
        logits = model(**{**inputs, "use_cache": use_cache}).logits[0]
        parts = unpack_token_values(logprobs_from_logits(logits, batch.targets[0].to(device)), batch.lengths)
        out[label] = max(float((a - p[:-1]).abs().max()) for a, p in zip(alone, parts, strict=True))
    rolled = unpack_token_values(logprobs_from_logits(model(**inputs).logits[0], torch.roll(batch.input_ids[0], -1).to(device)),
                                 batch.lengths)
    # each sequence's last position now "predicts" the next sequence's first token
    out["labels rolled on the packed row"] = max(float(r[-1].abs()) for r in rolled[:-1])
    return out


def ragged_sequences(tokenizer, n: int, *, seed: int = 0, lengths=(8, 16, 32, 64, 128, 200),
                     max_length: int | None = None) -> list[list[int]]:
    """``n`` random token sequences of mixed lengths (a ragged batch for the throughput comparison),
    none longer than ``max_length`` (the model's context: learned positions end there)."""
    if max_length:
        lengths = [length for length in lengths if length <= max_length] or [max_length]
    rng = random.Random(seed)
    def first():  # BOS where the tokenizer has one (Qwen2-style tokenizers have none: a random token then)
        return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else rng.randrange(4, len(tokenizer))

    return [[first()] + [rng.randrange(4, len(tokenizer)) for _ in range(rng.choice(lengths) - 1)] for _ in range(n)]


def attention_entries(lengths: list[int]) -> dict[str, int]:
    """Attention score entries per layer and head: padded, packed with one dense block-diagonal
    mask (CPU sdpa), packed with variable-length kernels (flash-attention)."""
    return {"padded": len(lengths) * max(lengths) ** 2, "packed, dense mask": sum(lengths) ** 2,
            "packed, varlen kernels": sum(n * n for n in lengths)}


def comparable_targets(mask: torch.Tensor) -> torch.Tensor:
    """(B, T − 1): 1 where target t + 1 is a real token predicted from a real token at t. A left-padded row's first
    token is "predicted" from a pad position, whose output no back-end defines: flash's unpadded kernel never
    computes it and sdpa computes an arbitrary one, so comparing back-ends there measures nothing (on the H100 it
    put 3.3 nats into the flash-vs-sdpa gap: docs/journal/2026-11-26.md, second lease)."""
    return mask[:, 1:] * mask[:, :-1]


def ppo_masks(model, tokenizer, prompts: list[str], *, max_new_tokens: int = 8, seed: int = 0):
    """Sample responses to left-padded prompts and mask after EOS, as a PPO actor does: returns
    ``(ids, mask, prompt_width, report)`` with ``report = padding_guard(mask)`` (old Qwen2 flash check)."""
    device = model.device
    prompt_ids, prompt_mask = (t.to(device) for t in encode_prompts(tokenizer, prompts))
    rollout = sample(model, prompt_ids, prompt_mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, generator=torch.Generator(device=device).manual_seed(seed))
    ids, mask = (t.cpu() for t in rollout.sequences())
    return ids, mask, prompt_ids.shape[1], padding_guard(mask, use_cache=True, attn_implementation="flash_attention_2",
                                                         model_type="qwen2")


# ---- sweeps -------------------------------------------------------------------------------------
def packed_speedup(throughput: dict[str, float]) -> float:
    """Packed over padded real tokens scored per second."""
    return throughput["packed"] / throughput["padded"]


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def captured_transformers_warnings():
    """Collect transformers' logged warnings (e.g. generate's right-padding warning) instead of
    printing each one; yields the list they are appended to."""
    handler = _Capture()
    logger = logging.getLogger("transformers")
    default = logger.handlers[:]
    for h in default:
        logger.removeHandler(h)
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        for h in default:
            logger.addHandler(h)
        logger.propagate = propagate


def divergence_sweep(models: dict[str, tuple], prompts: list[str], *, max_new_tokens: int = 6) -> tuple[dict, list[str]]:
    """``generation_divergence`` per model; returns it and the distinct transformers warnings raised."""
    results = {}
    with captured_transformers_warnings() as messages:
        for name, (model, tokenizer) in progress.track(models.items(), "greedy generation, alone and batched",
                                                       unit="model", total=len(models)):
            results[name] = generation_divergence(model, tokenizer, prompts, max_new_tokens=max_new_tokens)
    return results, list(dict.fromkeys(messages))


@torch.no_grad()
def flash_checks(model_name: str, prompts: list[str], texts: list[str]) -> dict:
    """Each flash back-end that can run here (``modeling.attention.FLASH_BACKENDS``: flash-attn 2, flash-attn 4)
    against sdpa on the same weights, bf16 on CUDA: ``{"backends": {name: gaps}, "skipped": {name: reason}}``.

    Gaps (max |Δ log p|, nats): ``vs_sdpa`` on a left-padded batch of ``prompts`` (flash's padded path:
    unpad, variable-length kernel, re-pad), over the targets predicted from real tokens (``comparable_targets``);
    ``packed_vs_alone`` etc. from ``packed_vs_alone`` on ``texts`` (one packed row, no mask: transformers routes it
    to the variable-length kernel by the restarting position ids); and ``right_divergent_rows``/``left_divergent_rows``:
    the S2 hazard itself, batched cached greedy generation under the flash back-end."""
    result: dict = {"backends": {}, "skipped": {}, "errors": {}}
    for backend in FLASH_BACKENDS:
        available, reason = flash_attention_status(backend)
        if not available:
            result["skipped"][backend] = reason
            continue
        gaps, errors = _flash_gaps(model_name, backend, prompts, texts)
        if gaps:
            result["backends"][backend] = gaps
        if errors:
            result["errors"][backend] = errors
    return result


def _flash_gaps(model_name: str, backend: str, prompts: list[str], texts: list[str]) -> tuple[dict, str]:
    """The measurements of ``flash_checks`` for one back-end, each on its own: a kernel that fails on this GPU, shape
    or path is recorded with its error ("packed row: ValueError: …"), never hidden, and the others still run."""
    flash, tokenizer = load(model_name, device="cuda", dtype=torch.bfloat16, attn_implementation=backend)
    sdpa, _ = load(model_name, device="cuda", dtype=torch.bfloat16, attn_implementation="sdpa")

    def padded_batch():
        ids, mask = (t.cuda() for t in encode_prompts(tokenizer, prompts))
        gap = (token_logprobs(flash, ids, mask) - token_logprobs(sdpa, ids, mask)) * comparable_targets(mask)
        return {"vs_sdpa": float(gap.abs().max())}

    def packed_row():
        return packed_vs_alone(flash, [tokenizer(x)["input_ids"] + [tokenizer.eos_token_id] for x in texts])

    def cached_generation():
        divergence = generation_divergence(flash, tokenizer, prompts)
        return {k: divergence[k] for k in ("right_divergent_rows", "left_divergent_rows", "rows")}

    gaps, errors = {}, []
    for what, measure in (("left-padded batch", padded_batch), ("packed row", packed_row), ("cached generation", cached_generation)):
        try:
            gaps.update(measure())
        except Exception as error:
            errors.append(f"{what}: {type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}")
    return gaps, "; ".join(errors)


# ---- verdict ------------------------------------------------------------------------------------
def verdict(divergence: dict, packed: dict, *, tolerance: float = 1e-5) -> tuple[bool, bool]:
    """(reproduced, fixed): some right-padded row's cached greedy continuation differs from generating
    it alone; no left-padded row does, and correct packing matches per-sequence scoring (≤ ``tolerance``)."""
    reproduced = any(d["right_divergent_rows"] > 0 for d in divergence.values())
    fixed = all(d["left_divergent_rows"] == 0 for d in divergence.values()) and all(
        p["packed"] <= tolerance for p in packed.values())
    return bool(reproduced), bool(fixed)


# ---- figures ------------------------------------------------------------------------------------
def plot_ppo_masks(ax, ids, mask, prompt_width: int, report: PaddingReport, eos_token_id: int) -> None:
    """The sequence mask with EOS cells marked, the prompt/response boundary, ◀ on right-padded rows."""
    plots.plot_mask(ax, mask, "prompt (left-padded) + response (masked after EOS)", eos=(ids == eos_token_id) & (mask > 0))
    ax.axvline(prompt_width - 0.5, color=plots.NEUTRAL_COLOR, lw=1)
    for row in report.rows_ending_in_padding:
        ax.text(mask.shape[1] - 0.5, row, "◀", color=plots.BUG_COLOR, va="center", fontsize=8)


def figure_ppo_masks(ids, mask, prompt_width: int, report: PaddingReport, eos_token_id: int):
    fig, ax = plt.subplots(figsize=(9, 3.2))
    plot_ppo_masks(ax, ids, mask, prompt_width, report, eos_token_id)
    return fig


def plot_divergence(ax, divergence: dict) -> None:
    """Share of rows whose cached greedy continuation differs from generating alone, per model and
    padding side, as % of the batch's rows with the count written on each bar (0 % bars included)."""
    names = list(divergence)
    for offset, side, bug in ((-0.2, "right", True), (0.2, "left", False)):
        counts = [divergence[n][f"{side}_divergent_rows"] for n in names]
        rows = [divergence[n]["rows"] for n in names]
        x = [i + offset for i in range(len(names))]
        ax.bar(x, [100 * c / r for c, r in zip(counts, rows, strict=True)], 0.4, color=plots.bug_fix_color(bug),
               label=f"{side} padding ({'bug' if bug else 'fix'})")
        for xi, c, r in zip(x, counts, rows, strict=True):
            ax.text(xi, 100 * c / r + 1, f"{c}/{r}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(0, 115)
    ax.set_ylabel("rows differing from alone (%)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))


def figure_divergence(divergence: dict):
    fig, ax = plt.subplots(figsize=(8, 3.5))
    plot_divergence(ax, divergence)
    return fig


def plot_packed(axes, packed: dict, tolerance: float = 1e-5) -> None:
    """Left: |Δ log p| of packed scoring (correct, cache on) per model; right: the cross-boundary
    term rolled labels add. Exact zeros are written, not drawn."""
    names = list(packed)
    width = 0.8 / len(names)
    for ax, labels in ((axes[0], ["packed", "packed, cache on"]), (axes[1], ["labels rolled on the packed row"])):
        for i, name in enumerate(names):
            x = [j + (i - (len(names) - 1) / 2) * width for j in range(len(labels))]
            values = [packed[name][label] for label in labels]
            ax.bar(x, [v if v > 0 else float("nan") for v in values], width, color=plots.SERIES_COLORS[i], label=name)
            for xi, v in zip(x, values, strict=True):
                if v == 0:
                    ax.text(xi, tolerance / 100, "0", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_yscale("log")
        ax.set_ylim(tolerance / 100, 100)
    axes[0].axhline(tolerance, color=plots.NEUTRAL_COLOR, ls="--", lw=1, label=f"tolerance {tolerance:g}")
    axes[0].text(0.01, tolerance, f"tolerance {tolerance:g}", transform=axes[0].get_yaxis_transform(), ha="left", va="bottom",
                 fontsize=8, color=plots.NEUTRAL_COLOR)
    axes[0].set_ylabel("max |Δ log p| (nats)")
    axes[0].set_title("packed vs each sequence alone")
    axes[1].set_ylabel("|log p| (nats)")
    axes[1].set_title("cross-boundary target")
    plots.legend_outside(axes[1], "right")


def figure_packed(packed: dict):
    fig, axes = plots.panel_grid(2, panel_height=3.2, gridspec_kw={"width_ratios": [2, 1]})
    plot_packed(axes, packed)
    fig.tight_layout()
    return fig


def plot_throughput(ax, throughput: dict[str, float], entries: dict[str, int]) -> None:
    """Real tokens per second, padded vs packed, each bar labelled with its attention entry count."""
    names = list(throughput)
    ax.bar(names, [throughput[n] for n in names], color=[plots.NEUTRAL_COLOR, plots.SERIES_COLORS[2]])
    for i, n in enumerate(names):
        key = "padded" if n == "padded" else "packed, dense mask"
        ax.text(i, throughput[n], f"{entries[key]:,} attention\nentries / head", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, max(throughput.values()) * 1.35)
    ax.set_ylabel("real tokens scored per second")


def figure_throughput(throughput: dict[str, float], entries: dict[str, int]):
    fig, ax = plt.subplots(figsize=(6, 3.4))
    plot_throughput(ax, throughput, entries)
    return fig


# ---- printers -----------------------------------------------------------------------------------
def throughput_note(lengths: list[int], throughput: dict[str, float], entries: dict[str, int]) -> str:
    """Why packed scoring can be faster although its dense mask has more attention entries: per-token work
    (embeddings, projections, MLP) scales with the tokens fed, rows × longest padded against Σ lengths packed. When
    packing is slower and its dense mask has more entries, the note says so, with the variable-length kernels' count
    beside it (what the entries cost is not measured here: the mask's size is the likely cause, not a proven one).
    ``entries``: ``attention_entries(lengths)``."""
    speedup = packed_speedup(throughput)
    tokens = len(lengths) * max(lengths) / sum(lengths)
    attention = entries["packed, dense mask"] / entries["padded"]
    line = (f"packed/padded throughput {speedup:.2f}×; padded rows feed {tokens:.2f}× the tokens packing feeds, and the packed "
            f"dense mask has {attention:.2f}× the attention entries of the padded batch")
    if speedup > 1 and attention > 1:
        line += ": the per-token work (projections, MLP) dominates at this size, so the token count decides, not the attention"
    elif speedup < 1 and attention > 1:
        varlen = entries["packed, varlen kernels"] / entries["padded"]
        line += (": packing is slower here, presumably because the dense mask's extra attention costs more than the padded"
                 " rows' extra tokens;"
                 f" variable-length flash kernels would attend over Σ lengthᵢ² entries only ({varlen:.2f}× the padded batch's)")
    return line


def packed_note(tolerance: float = 1e-5) -> str:
    """The caption of ``figure_packed``."""
    return ("Left: the largest |Δ log p| between scoring the packed row and scoring each sequence alone, per model, with "
            f"the cache off (correct) and on (log scale; dashed: the {tolerance:g} tolerance). Right: the |log p| that labels "
            "rolled on the packed row give a sequence's last token for predicting the next sequence's first, a target that "
            "should not exist. An exact 0 is written as 0.")


def packed_lines(packed: dict) -> str:
    return "\n".join(f"{name:>18}: " + ", ".join(f"{k}: {v:.1e}" for k, v in r.items()) for name, r in packed.items())


def flash_lines(flash: dict) -> str:
    """One line per flash back-end: its gaps, or why it was skipped."""
    lines = []
    for name, r in flash["backends"].items():
        parts = []
        if "vs_sdpa" in r:
            parts.append(f"vs sdpa (left-padded batch) max |Δ log p| = {r['vs_sdpa']:.2e}")
        if "packed" in r:
            parts.append(f"packed row vs alone {r['packed']:.2e} (cache on {r['packed, cache on']:.2e})")
        if "rows" in r:
            parts.append(f"cached greedy generation, rows differing from alone: right-padded {r['right_divergent_rows']}/{r['rows']}, "
                         f"left-padded {r['left_divergent_rows']}/{r['rows']}")
        lines.append(f"{name}, bf16 on CUDA: " + "; ".join(parts))
    lines += [f"{name}: failed on this machine: {error}" for name, error in flash.get("errors", {}).items()]
    return "\n".join(lines + [f"{name}: skipped: {reason}" for name, reason in flash["skipped"].items()])


def divergent_example(divergence: dict, tokenizer, prompts: list[str]) -> str:
    """One prompt whose right-padded continuation differs from generating it alone, as text."""
    for prompt, alone, right in zip(prompts, divergence["alone"], divergence["right"], strict=True):
        if alone != right:
            return f"e.g. {prompt!r}: alone → {tokenizer.decode(alone)!r}, right-padded batch → {tokenizer.decode(right)!r}"
    return "no row diverged"


# ---- explorer -----------------------------------------------------------------------------------
def padding_side_explorer(models: dict[str, tuple], prompts: list[str]) -> Explorer:
    """Rows whose greedy continuation differs from generating alone (the notebook's figure, one model);
    ``last["divergent_rows"]`` is the count for the chosen padding side."""

    cache: dict = {}

    def draw(model_name, side):
        if model_name not in cache:
            cache[model_name] = divergence_sweep({model_name: models[model_name]}, prompts)[0]
        fig, ax = plt.subplots(figsize=(6, 3))
        plot_divergence(ax, cache[model_name])
        ax.set_title(f"{model_name}: {side} padding selected")
        return {"divergent_rows": cache[model_name][model_name][f"{side}_divergent_rows"]}

    controls = {
        "model_name": widgets.Dropdown(options=list(models), description="model"),
        "side": widgets.ToggleButtons(options=["right", "left"], value="right", description="padding"),
    }
    return Explorer(controls, draw, "Batched cached generation: right vs left padding")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(*, divergence: dict, packed: dict, report: PaddingReport, throughput: dict[str, float], entries: dict[str, int],
            flash: dict) -> dict:
    """Notebook 02's ``notebook_api.write_metrics`` keyword arguments."""
    reproduced, fixed = verdict(divergence, packed)
    rows = sum(d["rows"] for d in divergence.values())
    return {
        "notebook": "02_right_padding_flash_attention", "reproduced": reproduced, "fixed": fixed,
        "metrics": {"right_padding_divergent_rows": {n: d["right_divergent_rows"] for n, d in divergence.items()},
                    "left_padding_divergent_rows": {n: d["left_divergent_rows"] for n, d in divergence.items()},
                    "ppo_masks_right_padded": report.right_padded, "guard_would_raise": report.would_raise_in_transformers_4_37_to_4_41,
                    "packed_max_abs_logp_diff": max(p["packed"] for p in packed.values()),
                    "packed_with_cache_max_abs_logp_diff": max(p["packed, cache on"] for p in packed.values()),
                    "packed_speedup": packed_speedup(throughput), "attention_entries": entries,
                    "flash_vs_sdpa_max_abs_logp_diff": max((r["vs_sdpa"] for r in flash["backends"].values() if "vs_sdpa" in r),
                                                           default=None),
                    "flash_backends": flash["backends"], "flash_errors": flash.get("errors", {}), "flash_attention": flash_lines(flash)},
        "headline": {"what": "batched cached greedy generation: rows whose continuation differs from generating alone",
                     "unit": "% of rows",
                     "bug": 100 * sum(d["right_divergent_rows"] for d in divergence.values()) / rows,
                     "fix": 100 * sum(d["left_divergent_rows"] for d in divergence.values()) / rows},
    }
