"""Padding, position ids and padding-free (packed) batches.

Three ways to put ragged sequences in one tensor, and the one thing each needs right:

* left padding (what generation wants): real tokens at the end of each row; position ids must
  come from the mask, or every row's positions shift by its pad count (pitfall S1);
* right padding (what a PPO actor produces after masking post-EOS tokens): fine for a training
  forward, but a hazard for cached batched generation (pitfall S2);
* packing (``pack_sequences``): all sequences concatenated in one row, position ids restarting
  at 0 per sequence, ``attention_mask=None`` and ``use_cache=False`` so transformers detects the
  sequence boundaries from the position ids. Next-token targets are made per sequence *before*
  packing, so no target crosses a boundary.
* bin-packed rows (``pack_rows``): the same, but sequences are first-fit-decreasing packed into
  several rows of a fixed capacity (about the longest sequence), as verl's and OpenRLHF's dynamic
  batches are. Without flash-attention's variable-length kernels (sdpa, eager: every CPU) a packed
  row attends over a dense (row length)² block mask, so one row of all the tokens costs total²;
  rows of the longest sequence's length cost rows × longest², less than the padded batch's
  sequences × longest². Flash-attention wants a single row (its packed path needs batch size 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions 0, 1, 2, … over the real tokens of each row, whatever the padding side.

    The OpenRLHF fix for S1 (PR #218): ``cumsum(mask) - 1``, with pad positions set to 1 (any
    valid index works there; those positions are masked out of attention and of every loss).
    """
    position_ids = attention_mask.long().cumsum(-1) - 1
    position_ids.masked_fill_(attention_mask == 0, 1)
    return position_ids


def pad_sequences(
    sequences: list[list[int]] | list[torch.Tensor], pad_token_id: int, side: str = "left", length: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack ragged token lists into ``(ids, attention_mask)`` padded on ``side`` ("left"/"right")."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    if len(sequences) == 0:
        raise ValueError("pad_sequences got no sequences")
    rows = [torch.as_tensor(s, dtype=torch.long).reshape(-1) for s in sequences]
    width = max(len(r) for r in rows) if length is None else length
    if any(len(r) > width for r in rows):
        raise ValueError(f"a sequence is longer than length={width}")
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row) == 0:
            continue
        if side == "left":
            ids[i, width - len(row) :] = row
            mask[i, width - len(row) :] = 1
        else:
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
    return ids, mask


def unpad(ids: torch.Tensor, attention_mask: torch.Tensor) -> list[torch.Tensor]:
    """The real tokens of each row (works for left, right or mixed padding)."""
    return [row[m.bool()] for row, m in zip(ids, attention_mask, strict=False)]


def repad(ids: torch.Tensor, attention_mask: torch.Tensor, pad_token_id: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Move every row's real tokens to the other padding side (same width)."""
    return pad_sequences(unpad(ids, attention_mask), pad_token_id, side=side, length=ids.shape[1])


def repeated_rows(rows: torch.Tensor) -> tuple[torch.Tensor, list[list[int]]] | None:
    """Identical rows of ``rows`` (B, …), grouped: ``(inverse, groups)`` with ``inverse[i]`` the group
    of row i and ``groups[g]`` that group's rows in order (``groups[g][0]`` the first); None when no
    row repeats. GRPO's groups repeat each prompt: the sampler prefills it once, scoring runs it once."""
    distinct, inverse = torch.unique(rows, dim=0, return_inverse=True)
    if distinct.shape[0] == rows.shape[0]:
        return None
    groups: list[list[int]] = [[] for _ in range(distinct.shape[0])]
    for row, group in enumerate(inverse.tolist()):
        groups[group].append(row)
    return inverse, groups


def padding_side_of(attention_mask: torch.Tensor) -> str:
    """``"left"``, ``"right"``, ``"none"`` (no padding) or ``"mixed"`` for a 0/1 mask."""
    mask = attention_mask.bool()
    if bool(mask.all()):
        return "none"
    # Left padded: once a row becomes real, it stays real. Right padded: once pad, stays pad.
    is_left = bool((mask.long().diff(dim=-1) >= 0).all())
    is_right = bool((mask.long().diff(dim=-1) <= 0).all())
    if is_left and not is_right:
        return "left"
    if is_right and not is_left:
        return "right"
    return "mixed"


# --------------------------------------------------------------------------------------------
# Padding-free (packed) batches
# --------------------------------------------------------------------------------------------
@dataclass
class PackedBatch:
    """Sequences concatenated into one row (batch size 1), ready for a packed forward.

    ``input_ids``/``position_ids``: shape (1, total_tokens). ``targets``: the next token of each
    position *within its own sequence* (``-100`` on each sequence's last token, which has no
    next token inside that sequence). ``lengths``: the length of each packed sequence.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    lengths: list[int]

    def model_inputs(self) -> dict:
        """Keyword arguments for a packed forward: no mask, no cache, restarting positions."""
        return dict(input_ids=self.input_ids, position_ids=self.position_ids, attention_mask=None, use_cache=False)

    def flash_varlen_kwargs(self) -> dict:
        """``flash_varlen_kwargs`` of this row (add them to ``model_inputs()`` under a flash back-end)."""
        return flash_varlen_kwargs(self.lengths, self.input_ids.device)


def pack_sequences(sequences: list[torch.Tensor] | list[list[int]]) -> PackedBatch:
    """Pack sequences into one row; next-token targets are shifted per sequence before packing."""
    rows = [torch.as_tensor(s, dtype=torch.long).reshape(-1) for s in sequences]
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("pack_sequences needs at least one sequence and no empty sequence")
    targets = [torch.cat([r[1:], torch.tensor([-100])]) for r in rows]
    positions = [torch.arange(len(r)) for r in rows]
    return PackedBatch(
        input_ids=torch.cat(rows)[None],
        position_ids=torch.cat(positions)[None],
        targets=torch.cat(targets)[None],
        lengths=[len(r) for r in rows],
    )


def unpack_token_values(packed_values: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    """Split a per-position tensor of shape (1, total) or (total,) into one tensor per sequence."""
    return list(torch.split(packed_values.reshape(-1), lengths))


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bin-pack items of ``lengths`` into bins of ``capacity``: longest first (ties: lower index
    first), each into the first bin with room, a new bin when none has. Returns the item indices
    of each bin, in insertion order."""
    if any(n > capacity for n in lengths):
        raise ValueError(f"an item of length {max(lengths)} does not fit in capacity={capacity}; raise the capacity")
    if any(n < 0 for n in lengths):
        raise ValueError("lengths must be ≥ 0")
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins


@dataclass
class PackedRows:
    """Sequences bin-packed into ``rows`` × ``capacity`` (see ``pack_rows``).

    ``input_ids``/``position_ids``: (rows, capacity); position ids restart at 0 for every sequence
    and for each row's trailing filler block (its own "sequence", attended only by itself).
    ``bins``: the sequence indices of each row, in order. ``gather_index``: for every real token
    of sequence 0, then 1, ... (the order of ``padded[mask]`` for right- or left-padded rows), its
    index in the flattened (rows × capacity) layout.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    bins: list[list[int]]
    lengths: list[int]
    gather_index: torch.Tensor

    def model_inputs(self) -> dict:
        """Keyword arguments for a packed forward: no mask, no cache, restarting positions."""
        return dict(input_ids=self.input_ids, position_ids=self.position_ids, attention_mask=None, use_cache=False)

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """(rows, capacity, ...) values → (real tokens, ...) in sequence order."""
        return values.reshape(-1, *values.shape[2:])[self.gather_index]

    def flash_varlen_kwargs(self) -> dict:
        """``flash_varlen_kwargs`` of a one-row packing (flash-attention's packed path takes batch size 1); the row's
        filler tail, if any, is one more segment."""
        if len(self.bins) != 1:
            raise ValueError(f"flash's variable-length path takes one packed row; this packing has {len(self.bins)} "
                             "(pack with capacity = the total length)")
        segments = [self.lengths[i] for i in self.bins[0]]
        tail = self.input_ids.shape[1] - sum(segments)
        return flash_varlen_kwargs(segments + ([tail] if tail else []), self.input_ids.device)


def pack_rows(sequences: list[torch.Tensor] | list[list[int]], capacity: int | None = None,
              filler: int | None = None) -> PackedRows:
    """First-fit-decreasing pack ``sequences`` into rows of ``capacity`` tokens (default: the
    longest sequence's length), built on the sequences' device. Each row's free tail holds
    ``filler`` (default: the first token of the first sequence, so no pad id appears in an unmasked
    batch), which nothing reads."""
    rows = [torch.as_tensor(s, dtype=torch.long).reshape(-1) for s in sequences]
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("pack_rows needs at least one sequence and no empty sequence")
    lengths = [len(r) for r in rows]
    capacity = max(lengths) if capacity is None else capacity
    bins = first_fit_decreasing(lengths, capacity)
    device = rows[0].device
    filler = int(rows[0][0]) if filler is None else filler
    ids, positions, starts = [], [], [0] * len(rows)
    for b, members in enumerate(bins):
        row, offset = [], 0
        for i in members:
            starts[i] = b * capacity + offset
            row.append(rows[i])
            offset += lengths[i]
        tail = capacity - offset
        ids.append(torch.cat(row + [torch.full((tail,), filler, dtype=torch.long, device=device)]))
        restarts = [torch.arange(lengths[i], device=device) for i in members] + [torch.arange(tail, device=device)]
        positions.append(torch.cat(restarts))
    gather_index = torch.cat([torch.arange(starts[i], starts[i] + lengths[i], device=device) for i in range(len(rows))])
    return PackedRows(torch.stack(ids), torch.stack(positions), bins, lengths, gather_index)


def flash_varlen_kwargs(segments: list[int], device) -> dict:
    """The variable-length arguments of a flash-attention forward over one packed row made of ``segments`` (the lengths
    of its sequences, in row order), as transformers takes them: ``cu_seq_lens_q/k`` (int32 cumulative lengths from 0)
    and ``max_length_q/k`` (Python ints). transformers derives the same values from restarting position ids, but keeps
    the maximum a 0-dim tensor outside tracing, which flash-attn 4 refuses (docs/GPU.md); passed like this they are
    used as given."""
    cumulative = torch.tensor([0, *accumulate(segments)], dtype=torch.int32, device=device)
    longest = int(max(segments))
    return {"cu_seq_lens_q": cumulative, "cu_seq_lens_k": cumulative, "max_length_q": longest, "max_length_k": longest}
