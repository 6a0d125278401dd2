"""Bin-packed padding-free rows (``batching.pack_rows``, the ``packed=True`` path of ``scoring.forward``).

The packer: every sequence exactly once, no row over capacity, first-fit-decreasing order (the
replayed packing puts each item in the first bin with room at its turn), and at most one row less
than half full (a first-fit property). The packed forward: equal log-probs and gradients to the
padded forward (fp32 ≤ 1e-5), for left- and right-padded batches, with the values scattered back
to the padded layout.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.core.batching import first_fit_decreasing, pack_rows, pack_sequences, pad_sequences
from workbench.modeling.scoring import forward, token_logprobs
from workbench.modeling.tiny import tiny_model

SETTINGS = settings(max_examples=80, deadline=None)


@st.composite
def items(draw):
    capacity = draw(st.integers(1, 40))
    lengths = draw(st.lists(st.integers(0, capacity), min_size=0, max_size=25))
    return lengths, capacity


@SETTINGS
@given(items())
def test_every_item_once_and_capacity_respected(case):
    lengths, capacity = case
    bins = first_fit_decreasing(lengths, capacity)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= capacity for b in bins)
    assert all(b for b in bins)


@SETTINGS
@given(items())
def test_first_fit_decreasing_order(case):
    lengths, capacity = case
    bins = first_fit_decreasing(lengths, capacity)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    where = {i: b for b, members in enumerate(bins) for i in members}
    # replay: items arrive longest first; each goes to the first bin that had room at its turn
    fill: list[int] = []
    for i in order:
        first_with_room = next((b for b, used in enumerate(fill) if used + lengths[i] <= capacity), len(fill))
        assert where[i] == first_with_room
        if first_with_room == len(fill):
            fill.append(0)
        fill[first_with_room] += lengths[i]
    # inside a bin, items are in arrival order (non-increasing length)
    for members in bins:
        assert [lengths[i] for i in members] == sorted((lengths[i] for i in members), reverse=True)
    # first fit: at most one bin is at most half full
    assert sum(2 * f <= capacity for f in fill) <= 1


@SETTINGS
@given(st.lists(st.integers(1, 30), min_size=1, max_size=20), st.integers(0, 10))
def test_pack_rows_layout_round_trips(lengths, extra):
    capacity = max(lengths) + extra
    g = torch.Generator().manual_seed(sum(lengths))
    sequences = [torch.randint(2, 50, (n,), generator=g) for n in lengths]
    batch = pack_rows(sequences, capacity)
    assert batch.input_ids.shape == batch.position_ids.shape == (len(batch.bins), capacity)
    # the gather index recovers every sequence in order, with positions restarting at 0
    assert torch.equal(batch.unpack(batch.input_ids), torch.cat(sequences))
    assert torch.equal(batch.unpack(batch.position_ids), torch.cat([torch.arange(n) for n in lengths]))
    # transformers' packed-sequence detection (a position that does not follow its left neighbour
    # by 1 starts a new sequence) sees exactly one block per sequence plus one per non-empty tail
    starts = (torch.diff(batch.position_ids, dim=-1, prepend=batch.position_ids[:, :1] - 1) != 1).sum()
    tails = sum(capacity - sum(lengths[i] for i in b) > 0 for b in batch.bins)
    assert int(starts) + len(batch.bins) == len(lengths) + tails


def test_bad_capacity_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="raise the capacity"):
        first_fit_decreasing([3, 9], 5)
    with pytest.raises(ValueError, match="no empty sequence"):
        pack_rows([[1, 2], []])


RAGGED = [8, 16, 32, 64, 5, 40, 23, 64, 9, 2, 31]


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_packed_logprobs_and_gradients_equal_padded(arch, side):
    model, _ = tiny_model(arch, seed=5)
    g = torch.Generator().manual_seed(0)
    ids, mask = pad_sequences([torch.randint(4, 60, (n,), generator=g) for n in RAGGED], 0, side=side)
    real = (mask[:, 1:] * mask[:, :-1]).bool()
    weights = torch.randn(real.shape, generator=g) * real
    grads = {}
    for packed in (False, True):
        model.zero_grad()
        logp, entropy = token_logprobs(model, ids, mask, packed=packed, with_entropy=True)
        (logp * weights).sum().backward()
        grads[packed] = (logp.detach(), entropy, {n: p.grad.clone() for n, p in model.named_parameters()})
    (lp0, e0, g0), (lp1, e1, g1) = grads[False], grads[True]
    assert (lp0 - lp1)[real].abs().max() <= 1e-5
    assert (e0 - e1)[real].abs().max() <= 1e-5
    for name in g0:
        assert torch.allclose(g0[name], g1[name], atol=1e-5, rtol=1e-4), name
    # scattered back to the padded layout: zeros at pads, fewer rows than sequences
    with torch.no_grad():
        hidden = forward(model, ids, mask, packed=True)
    assert (hidden[~mask.bool()] == 0).all()
    lengths = mask.sum(-1).tolist()
    assert len(pack_rows([ids[i, mask[i].bool()] for i in range(len(lengths))]).bins) < len(lengths)


@SETTINGS
@given(lengths=st.lists(st.integers(1, 12), min_size=1, max_size=6), extra=st.integers(0, 5))
def test_flash_varlen_kwargs_are_transformers_own_boundaries_with_int_lengths(lengths, extra):
    """The boundaries given to a flash forward equal the ones transformers derives from the restarting position ids
    (its own function), and the maximum is a Python int (transformers' is a 0-dim tensor, which flash-attn 4 refuses)."""
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    sequences = [list(range(1, n + 1)) for n in lengths]
    for batch in (pack_sequences(sequences), pack_rows(sequences, sum(lengths) + extra)):
        given_kwargs = batch.flash_varlen_kwargs()
        (cu_q, cu_k), (max_q, max_k) = prepare_fa_kwargs_from_position_ids(batch.position_ids)
        assert torch.equal(given_kwargs["cu_seq_lens_q"], cu_q.to(torch.int32))
        assert torch.equal(given_kwargs["cu_seq_lens_k"], cu_k.to(torch.int32))
        assert type(given_kwargs["max_length_q"]) is int and given_kwargs["max_length_q"] == int(max_q) == int(max_k)
    with pytest.raises(ValueError, match="one packed row"):
        pack_rows([[1, 2], [3, 4]], 2).flash_varlen_kwargs()


def test_a_flash_model_gets_the_boundaries_and_an_sdpa_model_does_not():
    seen = []

    class Recorder(torch.nn.Module):
        def __init__(self, attn):
            super().__init__()
            self.config = type("Config", (), {"_attn_implementation": attn})()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, **kwargs):
            seen.append(kwargs)
            return type("Output", (), {"logits": torch.zeros(*input_ids.shape, 3)})()

    ids, mask = pad_sequences([[5, 6, 7], [8, 9]], 0, side="left")
    for attn in ("flash_attention_4", "sdpa"):
        forward(Recorder(attn), ids, mask, packed=True)
    flash, sdpa = seen
    assert flash["cu_seq_lens_q"].tolist() == [0, 3, 5] and flash["max_length_q"] == 3
    assert "cu_seq_lens_q" not in sdpa and "max_length_q" not in sdpa
