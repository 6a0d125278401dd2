"""Exercise P13 · ``whiten(values[B, T], mask[B, T]) -> [B, T]``: whiten advantages over real tokens only.

(x − mean) / sqrt(var + eps) with mean and variance over the positions where ``mask`` is 1, the whole batch at
once (PPO's advantage whitening). Graded on: the statistics of the output over real tokens (mean 0, std 1),
invariance to extra padding columns holding garbage, a finite output on a constant batch (the eps), and
finite padding positions. The known wrong ones: whitening over padding, per-row statistics, dividing the
masked sum by all B·T positions, scaling without centring.
"""

from __future__ import annotations

import torch

from workbench.exercises.common import CaseFailure, Outcome, diagnose, lesson_link, tensor_out
from workbench.exercises.course import COURSE
from workbench.exercises.solutions.p13_whiten import whiten as reference  # the reference is the graded solution

EXERCISE = COURSE["p13_whiten"]
SEE = lesson_link(EXERCISE.lesson)


def _over_padding(values, mask):
    return (values - values.mean()) / values.std().clamp_min(1e-8)


def _per_row(values, mask):
    m = mask.to(values.dtype)
    n = m.sum(-1, keepdim=True).clamp_min(1)
    mean = (values * m).sum(-1, keepdim=True) / n
    var = (((values - mean) * m) ** 2).sum(-1, keepdim=True) / n
    return (values - mean) * torch.rsqrt(var + 1e-8)


def _all_positions_denominator(values, mask):
    m = mask.to(values.dtype)
    mean = (values * m).sum() / m.numel()
    var = (((values - mean) * m) ** 2).sum() / m.numel()
    return (values - mean) * torch.rsqrt(var + 1e-8)


def _no_centring(values, mask):
    m = mask.to(values.dtype)
    n = m.sum()
    mean = (values * m).sum() / n
    var = (((values - mean) * m) ** 2).sum() / n
    return values * torch.rsqrt(var + 1e-8)


MISTAKES = {
    "padding": ("whitening over padding: the padded positions enter your mean and variance, so the real tokens' "
                f"advantages shift with the amount of padding — compute both over mask == 1 only — see {SEE}", _over_padding),
    "denominator": ("normalising over padding: you mask the sums but divide by all B·T positions, not by the number of "
                    f"real tokens — see {SEE}", _all_positions_denominator),
    "per_row": ("per-row statistics: each response is whitened on its own, which erases the differences between "
                f"responses that the advantages carry — whiten over all real tokens of the batch — see {SEE}", _per_row),
    "no_centring": ("scaled without centring: the mean is not subtracted (that is reward scaling, shift_mean=False; "
                    "advantage whitening centres them)", _no_centring),
}


def _same_on_real(mask):
    def same(a, b):
        keep = mask.bool()
        return a.shape == b.shape and torch.allclose(a[keep].double(), b[keep].double(), atol=2e-3, rtol=2e-2)
    return same


def _batch(seed: int = 0, pad_value: float = 3.0):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([12, 3, 9, 7, 1, 10])
    mask = (torch.arange(12)[None] < lengths[:, None]).float()
    values = torch.randn(6, 12, generator=generator) * 2 + 1
    values = torch.where(mask.bool(), values, torch.full_like(values, pad_value))
    return values, mask


def _call(fn, values, mask):
    out = tensor_out(fn(values.clone(), mask.clone()), "a Tensor[B, T]", shape=tuple(values.shape), floating=True)
    if not bool(torch.isfinite(out[mask.bool()]).all()):
        raise CaseFailure("NaN or inf on real tokens", "divide by sqrt(var + eps): a batch can have zero variance")
    return out


@EXERCISE.add_case("statistics", "a ragged batch (lengths 12, 3, 9, 7, 1, 10), padding holding 3.0",
                   "mean 0 and std 1 over the real tokens, each value whitened with the batch's statistics")
def _statistics(fn) -> Outcome:
    values, mask = _batch()
    out = _call(fn, values, mask)
    keep = mask.bool()
    real = out[keep].double()
    mean, std = float(real.mean()), float(real.std(unbiased=False))
    # the values themselves, not only their moments: per-row whitening also gives mean 0 and std ≈ 1 overall.
    # Biased or unbiased variance are both accepted (they differ by sqrt(n / (n − 1)) with n the real tokens).
    expected = reference(values, mask)[keep].double()
    n = int(keep.sum())
    gap = min(float((real - expected * scale).abs().max()) for scale in (1.0, ((n - 1) / n) ** 0.5))
    ok = abs(mean) < 1e-4 and abs(std - 1) < 0.03 and gap < 1e-3
    mistake = "" if ok else diagnose(out, MISTAKES, (values, mask), same=_same_on_real(mask))
    return Outcome(f"mean {mean:.4g}, std {std:.4g} over real tokens; max |out − whitened| {gap:.3g}", ok, mistake)


@EXERCISE.add_case("padding_invariance", "the same batch with 5 more padding columns holding 50.0", "the real tokens' outputs unchanged")
def _padding_invariance(fn) -> Outcome:
    values, mask = _batch()
    out = _call(fn, values, mask)
    wide_values = torch.cat([values, torch.full((6, 5), 50.0)], dim=1)
    wide_mask = torch.cat([mask, torch.zeros(6, 5)], dim=1)
    wide = _call(fn, wide_values, wide_mask)
    keep = mask.bool()
    gap = float((wide[:, :12][keep] - out[keep]).abs().max())
    ok = gap < 1e-4
    mistake = "" if ok else diagnose(wide, MISTAKES, (wide_values, wide_mask), same=_same_on_real(wide_mask)) or \
        f"extra padding changes the real tokens' values: statistics over padding — see {SEE}"
    return Outcome(f"max change on real tokens {gap:.3g}", ok, mistake)


@EXERCISE.add_case("constant", "every real value equal (variance 0)", "a finite output")
def _constant(fn) -> Outcome:
    mask = (torch.arange(5)[None] < torch.tensor([5, 2])[:, None]).float()
    values = torch.full((2, 5), 0.75)  # 0.75 · 7 / 7 is exact in floating point: the variance is exactly 0
    out = fn(values.clone(), mask.clone())
    out = tensor_out(out, "a Tensor[B, T]", shape=(2, 5), floating=True)
    ok = bool(torch.isfinite(out).all())
    return Outcome(f"{out.tolist()}", ok, "" if ok else "0/0 on a constant batch: add eps inside the square root (var + eps)")


@EXERCISE.add_case("padding_finite", "padding positions holding NaN", "a finite output everywhere")
def _padding_finite(fn) -> Outcome:
    values, mask = _batch(pad_value=float("nan"))
    out = tensor_out(fn(values.clone(), mask.clone()), "a Tensor[B, T]", shape=tuple(values.shape), floating=True)
    ok = bool(torch.isfinite(out).all())
    mistake = "" if ok else ("NaN on the output: padding positions hold NaN here (as after a log of 0) and your statistics "
                             "or output take them in — select with the mask (torch.where), don't multiply by it")
    return Outcome("finite everywhere" if ok else "NaN or inf in the output", ok, mistake)
