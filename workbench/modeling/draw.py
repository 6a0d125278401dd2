"""``torch.multinomial(probs, 1)`` on a CPU, the same tokens and generator state, about twice as fast.

Why: at a 32k vocabulary, ``torch.multinomial``'s single draw is ~40% of a sampler step on one CPU
core. For one sample per row it computes ``argmax(probs / q)`` with ``q`` a fresh tensor filled by
``exponential_`` (Gumbel-max in disguise), and on a CPU ``exponential_`` is a serial loop: per
element one 64-bit draw of the generator's Mersenne twister, ``u = (bits & (2^53 - 1)) · 2^-53`` and
``-log1p(-u)`` through the C library, in double, then rounded to the tensor's dtype (~35 ns per
element here; 256,000 of them per step for 8 rows × 32,000 tokens).

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

Only for float32 probabilities on a CPU with one sample per row; anything else (CUDA's philox
generator, float64, bf16) goes to ``torch.multinomial`` itself.
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
    if probs.device.type != "cpu" or probs.dtype != torch.float32 or probs.dim() != 2:
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    q = _exponential(probs.shape, generator)
    return torch.div(probs, q, out=q).argmax(-1)


def _exponential(shape, generator) -> torch.Tensor:
    """``torch.empty(shape).exponential_(generator=generator)`` (float32, CPU), bitwise; see module doc."""
    bits = torch.empty(shape, dtype=torch.int64).random_(generator=generator).bitwise_and_(_MANTISSA_53)
    q = bits.double().mul_(2.0**-53).neg_().log1p_().neg_()  # (-1 / λ) · log1p(-u) at λ = 1
    near = q.view(torch.int64).add(_SHIFT).bitwise_and_(_DROPPED).le_(2 * _MARGIN)
    if bool(near.any()):  # next to a float32 rounding midpoint: the C library's log1p decides
        index = near.nonzero(as_tuple=True)
        exact = [-math.log1p(-(b * 2.0**-53)) for b in bits[index].tolist()]
        q[index] = torch.tensor(exact, dtype=torch.float64)
    return q.float()
