"""``torch.multinomial(probs, 1)`` on a CPU, the same tokens and generator state, about twice as fast.

Why: at a 32k vocabulary, ``torch.multinomial``'s single draw is ~40% of a sampler step on one CPU
core. For one sample per row it computes ``argmax(probs / q)`` with ``q`` a fresh tensor filled by
``exponential_`` (Gumbel-max in disguise), and on a CPU ``exponential_`` is a serial loop: per
element one 64-bit draw of the generator's Mersenne twister, ``u = (bits & (2^53 - 1)) · 2^-53`` and
``-log1p(-u)`` through the C library, in double, then rounded to the tensor's dtype (~35 ns per
element here; 256,000 of them per step for 8 rows × 32,000 tokens: 9-10 ms).

``multinomial_one`` takes the same 64-bit draws in one ``random_()`` call on an int64 tensor (which
consumes one ``random64()`` per element, in the same order) and does the rest as vectorised tensor
ops: the same mask and scale, ``log1p`` in double, the rounding to float32, the divide and the
argmax. The one op that is not the same instruction sequence is ``log1p``: the vectorised one
(SLEEF) and the C library's may differ by an ulp in double (measured: 8% of values, by one ulp),
which changes the float32 value only for a double within a few ulps of a float32 rounding midpoint
(measured: 0 of 20 million). Those elements (about one per 4 million) are recomputed with Python's
``math.log1p`` (the C library's, the function ``exponential_`` calls): ``q`` is then the tensor
``exponential_`` fills, bitwise, and so are the token and the generator's state
(tests/modeling/test_draw.py, against ``torch.multinomial`` and ``exponential_``).

The rows go through in chunks of ~65,536 probabilities (2 rows at a 32k vocabulary), whose int64,
double and float32 buffers stay in a core's L2 cache: the generator is read in the same row-major
order, and on this shared machine the unchunked passes over 8 × 32k ran at L3/memory speed (7.9 vs
11.5 ms per draw against ~7.2 vs 11.5 chunked, same-process A/B).

Only the winner's variate has to be exact (see the comment in ``multinomial_one``): the midpoint
test and the ``math.log1p`` recomputation run on the whole tensor only when a row's winner is next
to a midpoint, has a near-tie, or the ratios hold NaN/inf.

Only for contiguous float32 probabilities on a CPU with one sample per row and at least 16,384
entries; anything else (CUDA's philox generator, float64, bf16, GRPO's 16 × 64 at the tiny size,
where ``torch.multinomial``'s one kernel is faster than a dozen small ops) goes to
``torch.multinomial`` itself. Not repeated: ``torch.multinomial``'s input checks (negative, inf or NaN
entries, a row summing to 0 raise there); the sampler's probabilities are the exp of a log-softmax
of logits it has checked to be finite.
"""

from __future__ import annotations

import math

import torch

_MANTISSA_53 = (1 << 53) - 1
_DROPPED = (1 << 29) - 1  # the low bits of a double's mantissa that its rounding to float32 drops
# (dropped bits + this) mod 2^29 ≤ 2 × _MARGIN ⟺ within _MARGIN double ulps of a float32 rounding midpoint (2^28)
_MARGIN = 64
_SHIFT = (1 << 29) + _MARGIN - (1 << 28)


def multinomial_one(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of ``probs`` (R, V) as ``torch.multinomial(probs, 1, generator=generator).squeeze(-1)``."""
    if (probs.device.type != "cpu" or probs.dtype != torch.float32 or probs.dim() != 2 or not probs.is_contiguous()
            or probs.numel() < _SMALL):
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    probs = probs.detach()  # (no gradient flows through a draw)
    rows, vocab = probs.shape
    step = max(1, _CHUNK // vocab)  # rows per pass; the generator is read in the same order (row-major) either way
    bits = torch.empty((min(step, rows), vocab), dtype=torch.int64)
    wide, narrow = torch.empty(bits.shape, dtype=torch.float64), torch.empty(bits.shape, dtype=torch.float32)
    tokens = []
    for first in range(0, rows, step):
        p = probs[first : first + step]
        b, log1p, ratio = bits[: len(p)], wide[: len(p)], narrow[: len(p)]
        b.random_(generator=generator).bitwise_and_(_MANTISSA_53)
        log1p.copy_(b).mul_(-(2.0**-53)).log1p_()  # log1p(-u) = -q in double, vectorised
        torch.div(p, ratio.copy_(log1p), out=ratio)  # -(p / q), q rounded to float32 as exponential_ rounds it
        token = ratio.argmin(-1)  # = argmax(p / q), first index included (and NaN first, as argmax)
        # Only an element within 2^-16 of its row's best ratio can win, so only the winner's q must be
        # exponential_'s bitwise: a q one float32 ulp off elsewhere moves its ratio by ~2^-22. Else (the winner next
        # to a rounding midpoint, near-ties, NaN/inf) the whole q exactly, as _exponential computes it.
        best = ratio.gather(-1, token[:, None])
        alone = (ratio <= best * (1 - _CONTENDER_MARGIN)).sum(-1) == 1
        if not (bool(alone.all()) and not bool(_near_midpoint(log1p.gather(-1, token[:, None])).any())):
            q = _exact(b, log1p.neg_())
            token = torch.div(p, q, out=q).argmax(-1)
        tokens.append(token)
    return tokens[0] if len(tokens) == 1 else torch.cat(tokens)


_SMALL = 16384  # below this many probabilities torch.multinomial's one kernel beats a dozen small ops
_CHUNK = 65536  # probabilities per pass: its int64, double and float32 buffers (1.25 MB) stay in a core's L2 cache
_CONTENDER_MARGIN = 2.0**-16


def _near_midpoint(q: torch.Tensor) -> torch.Tensor:
    """Doubles within _MARGIN ulps of a float32 rounding midpoint (either sign)."""
    return q.view(torch.int64).add(_SHIFT).bitwise_and_(_DROPPED).le_(2 * _MARGIN)


def _exact(bits: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """float32 ``exponential_`` variates from their masked 64-bit draws ``bits`` and ``q`` = -log1p(-u) computed by the
    vectorised log1p: the elements next to a float32 rounding midpoint recomputed by the C library's (see module doc)."""
    near = _near_midpoint(q)
    if bool(near.any()):
        index = near.nonzero(as_tuple=True)
        exact = [-math.log1p(-(b * 2.0**-53)) for b in bits[index].tolist()]
        q[index] = torch.tensor(exact, dtype=torch.float64)
    return q.float()


def _exponential(shape, generator) -> torch.Tensor:
    """``torch.empty(shape).exponential_(generator=generator)`` (float32, CPU), bitwise; see module doc."""
    bits = torch.empty(shape, dtype=torch.int64).random_(generator=generator).bitwise_and_(_MANTISSA_53)
    return _exact(bits, bits.double().mul_(2.0**-53).neg_().log1p_().neg_())  # (-1 / λ) · log1p(-u) at λ = 1
