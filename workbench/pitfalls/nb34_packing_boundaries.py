"""Pitfall P34: packed sequences attending across their boundaries.

Packing puts several sequences in one row (no padding); position ids restart at 0 at each sequence, and
the attention must be block-diagonal: a token of sequence 2 must not see sequence 1. FlashAttention's
varlen kernels get the boundaries from ``cu_seqlens``; on the SDPA/eager path transformers builds the
block-diagonal mask from the restarting ``position_ids`` (``find_packed_sequence_indices``, since PR
#39194) — but only when ``attention_mask is None``. Packed RL trainers (verl's ``use_remove_padding``,
LlamaFactory, TRL's padding-free collator) often pass a 2-D all-ones mask as well: the detection is then
skipped, SDPA takes its plain causal path and every later sequence attends to every earlier one
(transformers PR #46634, not merged; LlamaFactory #10736; TRL PR #3526). The loss still falls; the
log-probs of a sequence depend on its neighbours in the pack. (The detection is skipped too when the
forward builds a KV cache: the scoring here passes ``use_cache=False``, as a training forward does.)

The signature: |log p(token | its sequence inside the pack) − log p(token | the sequence alone)|. Zero for
the first sequence of a pack, growing for the later ones with the bug; float noise with the fix (no 2-D
mask: the position ids mark the boundaries; or an explicit block-diagonal 4-D mask).
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core import progress
from workbench.viz import plots
from workbench.viz.explorer import Explorer

MASKS = ("2-D all-ones mask", "position ids only", "block-diagonal 4-D mask")
BUG, FIX = MASKS[0], MASKS[1]


# ---- measurements --------------------------------------------------------------------------------
def pack(segments: list[list[int]]) -> dict:
    """One packed row: ``input_ids`` (1, L), ``position_ids`` restarting at 0 per segment, ``segment`` ids."""
    ids = torch.tensor([t for s in segments for t in s])[None]
    positions = torch.cat([torch.arange(len(s)) for s in segments])[None]
    segment = torch.cat([torch.full((len(s),), i) for i, s in enumerate(segments)])
    return {"input_ids": ids, "position_ids": positions, "segment": segment}


def block_mask(segment: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The (1, 1, L, L) additive mask: 0 where query and key share a segment and key ≤ query, −inf elsewhere."""
    n = segment.numel()
    allowed = (segment[:, None] == segment[None, :]) & torch.ones(n, n, dtype=torch.bool).tril()
    return torch.zeros(n, n, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


def _token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log p(ids[t] | prefix) for t ≥ 1 of a (1, L) row: a (L − 1,) tensor."""
    return torch.log_softmax(logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]


@torch.no_grad()
def packed_logprobs(model, packed: dict, mask: str = FIX) -> torch.Tensor:
    """Per-token log-probs of the packed row under one way of telling the model the boundaries (``MASKS``)."""
    # use_cache=False: a forward that builds a KV cache skips the packed detection as well (it is for training)
    device = next(model.parameters()).device
    kwargs = {"input_ids": packed["input_ids"].to(device), "position_ids": packed["position_ids"].to(device), "use_cache": False}
    if mask == "2-D all-ones mask":
        kwargs["attention_mask"] = torch.ones_like(kwargs["input_ids"])
    elif mask == "block-diagonal 4-D mask":
        kwargs["attention_mask"] = block_mask(packed["segment"], next(model.parameters()).dtype).to(device)
    elif mask != "position ids only":
        raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
    return _token_logprobs(model(**kwargs).logits, kwargs["input_ids"]).cpu()


@torch.no_grad()
def alone_logprobs(model, segment: list[int]) -> torch.Tensor:
    """Per-token log-probs of one sequence scored on its own."""
    ids = torch.tensor(segment, device=next(model.parameters()).device)[None]
    return _token_logprobs(model(input_ids=ids, use_cache=False).logits, ids).cpu()


def boundary_errors(model, segments: list[list[int]], masks: tuple[str, ...] = MASKS, *,
                    alone: list[torch.Tensor] | None = None) -> dict:
    """For each mask: per segment, the max and mean |log p inside the pack − log p alone| over the segment's
    tokens after its first (whose prediction in the pack comes from the previous segment). ``alone``: the segments'
    ``alone_logprobs`` where already scored."""
    packed = pack(segments)
    starts = torch.tensor([0] + [len(s) for s in segments]).cumsum(0)
    alone = [alone_logprobs(model, s) for s in segments] if alone is None else alone
    out = {}
    for mask in masks:
        inside = packed_logprobs(model, packed, mask)
        per_segment = []
        for i, s in enumerate(segments):
            # token j of segment i (j ≥ 1) is predicted at packed position starts[i] + j − 1
            diff = (inside[int(starts[i]):int(starts[i]) + len(s) - 1] - alone[i]).abs()
            per_segment.append({"max": float(diff.max()), "mean": float(diff.mean())})
        out[mask] = per_segment
    return out


# ---- sweeps --------------------------------------------------------------------------------------
def segment_sweep(model, segments: list[list[int]], counts: list[int], *, errors: dict | None = None,
                  alone: list[torch.Tensor] | None = None) -> list[dict]:
    """Packs of the first k segments for each k in ``counts``: the last segment's mean and max error per mask. Each
    segment is scored alone once for every pack (``alone``: the segments' ``alone_logprobs`` where already scored);
    ``errors``, ``boundary_errors`` of all the segments where already measured, stands for the pack of all of them."""
    if alone is None:
        alone = [alone_logprobs(model, s) for s in segments[:max(counts, default=0)]]
    rows = []
    for k in progress.track(counts, "pack sizes", unit="pack"):
        whole = errors is not None and k == len(segments)
        errors_k = errors if whole else boundary_errors(model, segments[:k], alone=alone[:k])
        rows.append({"segments": k, "tokens": sum(len(s) for s in segments[:k]),
                     **{m: errors_k[m][-1] for m in MASKS}})
    return rows


# ---- verdict -------------------------------------------------------------------------------------
def verdict(errors: dict, *, tolerance: float = 1e-4) -> tuple[bool, bool]:
    """(reproduced, fixed) from one ``boundary_errors`` result of a pack of ≥ 2 segments.

    Reproduced: with the 2-D mask the first segment is exact (< ``tolerance``) and a later one is off by more
    than 100 × ``tolerance``; fixed: with position ids only and with the block mask every segment is within
    ``tolerance`` of its log-probs alone.
    """
    bug = errors[BUG]
    reproduced = len(bug) > 1 and bug[0]["max"] < tolerance and max(s["max"] for s in bug[1:]) > 100 * tolerance
    fixed = all(s["max"] < tolerance for m in MASKS[1:] if m in errors for s in errors[m])
    return reproduced, fixed


# ---- figures -------------------------------------------------------------------------------------
STYLES = {BUG: (plots.BUG_COLOR, "o-", "2-D ones (bug)"), FIX: (plots.FIX_COLOR, "s-", "position ids (fix)"),
          MASKS[2]: (plots.NEUTRAL_COLOR, "^--", "4-D mask (fix)")}  # colour, style, legend entry


def _plot_per_mask(ax, points: dict, floor: float, xlabel: str, ylabel: str) -> None:
    """One line per mask from ``points[mask] = (x, y)`` in its ``STYLES``, on a log axis (an exact zero drawn at ``floor``)."""
    for mask, (x, y) in points.items():
        color, style, label = STYLES[mask]
        ax.plot(x, [max(v, floor) for v in y], style, color=color, label=label)
    ax.set_yscale("log")
    if any(v <= floor for _, y in points.values() for v in y):
        plots.draw_floor(ax, floor)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    plots.integer_axis(ax.xaxis)
    plots.note_coinciding(ax, legend_kw=plots.legend_outside(ax))  # below the axes: the lines span its height


def plot_segments(ax, errors: dict, floor: float = 1e-8) -> None:
    """Max |Δ log p| of each segment of one pack, per mask (an exact zero drawn at ``floor``)."""
    points = {mask: (range(len(per_segment)), [s["max"] for s in per_segment]) for mask, per_segment in errors.items()}
    _plot_per_mask(ax, points, floor, "segment in the pack", "max |Δ log p|")


def plot_sweep(ax, rows: list[dict], floor: float = 1e-8) -> None:
    """The last segment's mean |Δ log p| vs the number of segments packed."""
    points = {mask: ([r["segments"] for r in rows], [r[mask]["mean"] for r in rows]) for mask in MASKS}
    _plot_per_mask(ax, points, floor, "segments in the pack", "mean |Δ log p|, last segment")


def figure_packing(errors: dict, rows: list[dict]):
    """The notebook's figure: per-segment errors of one pack, and the sweep over pack sizes."""
    fig, axes = plots.panel_grid(2, panel_height=4.0)
    plot_segments(axes[0], errors)
    plot_sweep(axes[1], rows)
    fig.tight_layout()
    return fig


# ---- printers ------------------------------------------------------------------------------------
def error_lines(errors: dict) -> str:
    return "\n".join(f"{mask:>24}: max |Δ log p| per segment " + ", ".join(f"{s['max']:.2e}" for s in per_segment)
                     for mask, per_segment in errors.items())


def sweep_lines(rows: list[dict]) -> str:
    return "\n".join(f"{r['segments']} segments ({r['tokens']} tokens): last segment mean |Δ log p| "
                     + ", ".join(f"{m} {r[m]['mean']:.2e}" for m in MASKS) for r in rows)


def headline_sentence(errors: dict) -> str:
    reproduced, fixed = verdict(errors)
    worst = max(s["max"] for s in errors[BUG])
    best = max(s["max"] for s in errors[FIX])
    return (f"max |Δ log p| of a packed segment: {worst:.3g} with a 2-D all-ones mask → {best:.2g} with position ids only; "
            + ("the neighbours leak in with the 2-D mask" if reproduced else "no leak seen with the 2-D mask here")
            + ("; the boundaries hold without it." if fixed else "."))


def packing_note(errors: dict) -> str:
    """The caption printed under the figure: what Δ log p is, the three masks, and where an exact zero is drawn."""
    zero = any(s["max"] == 0 for per_segment in errors.values() for s in per_segment)
    return ("Δ log p: a token's log-prob inside the pack minus the same segment scored alone. Left: the largest |Δ log p| "
            "of each segment of one pack; right: the mean |Δ log p| of the last segment as more segments are packed before "
            f"it. Masks: {BUG} (bug), {FIX} (fix), {MASKS[2]} (the other fix)"
            + ("; an exact 0 is drawn on the dotted line at 1e-08." if zero else "."))


# ---- explorer ------------------------------------------------------------------------------------
def pack_explorer(model, segments: list[list[int]]) -> Explorer:
    """A slider for the number of segments packed and a mask choice: per-segment errors, redrawn."""

    def draw(count, mask):
        errors = boundary_errors(model, segments[:count], (mask,))
        fig, ax = plt.subplots(figsize=(6, 3.2))
        plot_segments(ax, errors)
        return errors

    count = widgets.IntSlider(value=min(3, len(segments)), min=2, max=len(segments), description="segments")
    mask = widgets.Dropdown(options=list(MASKS), value=BUG, description="mask")
    return Explorer({"count": count, "mask": mask}, draw, title="P34: a segment's log-probs inside the pack vs alone")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(errors: dict, rows: list[dict]) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 34."""
    reproduced, fixed = verdict(errors)
    return dict(
        notebook="34_packing_boundaries", reproduced=reproduced, fixed=fixed,
        metrics={"per_segment": errors, "pack_size_sweep": rows},
        headline={"what": f"max |log p(segment in a pack of {len(errors[BUG])}) − log p(alone)|", "unit": "nats",
                  "bug": max(s["max"] for s in errors[BUG]), "fix": max(s["max"] for s in errors[FIX])},
    )
