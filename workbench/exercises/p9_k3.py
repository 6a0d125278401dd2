"""Exercise P9 · ``k3(logp[B, T], ref_logp[B, T]) -> [B, T]``: the k3 estimator of KL(π‖π_ref), per token.

k3 = exp(r) − r − 1 with r = ref_logp − logp (Schulman's "approximating KL" note; TRL GRPO): unbiased,
≥ 0, exactly 0 where the two log-probs agree. Graded on values, non-negativity (tiny gaps, where the
naive formula rounds below 0 in float32), exact zeros, and finiteness for a huge gap (a clamp of the
log-ratio, as verl's ``low_var_kl`` does). The known wrong ones: the sign error (the ratio π/π_ref, which
estimates the other direction), k1, k2, a forgotten −1.
"""

from __future__ import annotations

import torch

from workbench.exercises.common import Outcome, close, diagnose, lesson_link, short, tensor_out
from workbench.exercises.course import COURSE

EXERCISE = COURSE["p9_k3"]
SEE = lesson_link(EXERCISE.lesson)
CLAMP = 20.0


def _exact(logp, ref_logp):
    r = (ref_logp - logp).double()
    return torch.expm1(r) - r


MISTAKES = {
    "sign": ("k3 sign error: you use r = logp − ref_logp (the ratio π/π_ref), which estimates KL(π_ref‖π), the other "
             f"direction — k3 = exp(ref_logp − logp) − (ref_logp − logp) − 1 — see {SEE}",
             lambda logp, ref: torch.expm1(logp - ref) - (logp - ref)),
    "k1": (f"this is k1 = logp − ref_logp: unbiased but negative on half the tokens, not k3 — see {SEE}", lambda logp, ref: logp - ref),
    "k2": (f"this is k2 = (logp − ref_logp)² / 2: biased, not k3 — see {SEE}", lambda logp, ref: (logp - ref) ** 2 / 2),
    "minus_one": ("the −1 is missing: your estimate is exp(r) − r, 1 where the policies agree instead of 0",
                  lambda logp, ref: torch.exp(ref - logp) - (ref - logp)),
}


def _relatively_close(a, b) -> bool:
    """Equal to 1 % of each value: tells the estimators apart for gaps of 1e-5 nats (k1 ~ 1e-5, k2 and k3 ~ 1e-10)."""
    a, b = a.detach().double(), b.detach().double()
    return a.shape == b.shape and bool(torch.isfinite(a).all()) and torch.allclose(a, b, rtol=1e-2, atol=1e-12)


def _inputs(seed: int, scale: float, shape=(3, 6)):
    generator = torch.Generator().manual_seed(seed)
    logp = -torch.rand(shape, generator=generator) * 3 - 0.1
    return logp, logp + torch.randn(shape, generator=generator) * scale


def _call(fn, logp, ref):
    return tensor_out(fn(logp.clone(), ref.clone()), "a per-token Tensor[B, T]", shape=tuple(logp.shape), floating=True)


@EXERCISE.add_case("values", "random log-probs, gaps of about 1 nat", "exp(r) − r − 1, r = ref_logp − logp")
def _values(fn) -> Outcome:
    logp, ref = _inputs(0, 1.0)
    out = _call(fn, logp, ref)
    ok = close(out, _exact(logp, ref), atol=1e-5, rtol=1e-4)
    return Outcome(short(out[0]), ok, "" if ok else diagnose(out, MISTAKES, (logp, ref)))


@EXERCISE.add_case("nonnegative", "gaps of about 3e-5 nats (8 × 64 tokens)", "every value ≥ 0")
def _nonnegative(fn) -> Outcome:
    logp, ref = _inputs(1, 3e-5, shape=(8, 64))
    out = _call(fn, logp, ref)
    low = float(out.min())
    mistake = ""
    if low < 0:  # another estimator (k1 is negative on half the tokens), else k3 rounded below 0
        mistake = diagnose(out, MISTAKES, (logp, ref), same=_relatively_close) or (
            f"float32 rounding makes exp(r) − r − 1 slightly negative for tiny gaps (min {low:.3g}): compute it as "
            f"torch.expm1(r) − r and clamp at 0 — see {SEE}")
    return Outcome(f"min {low:.3g}", low >= 0, mistake)


@EXERCISE.add_case("zero_when_equal", "ref_logp equal to logp", "exactly 0 on every token")
def _zero_when_equal(fn) -> Outcome:
    logp, _ = _inputs(2, 1.0)
    out = _call(fn, logp, logp.clone())
    ok = bool((out == 0).all())
    return Outcome(f"max {float(out.abs().max()):.3g}", ok, "" if ok else diagnose(out, MISTAKES, (logp, logp.clone())))


@EXERCISE.add_case("large_gap", "gaps of 90–120 nats", "finite, ≥ 0 and large")
def _large_gap(fn) -> Outcome:
    logp = torch.tensor([[-100.0, -0.5, -120.0]])
    ref = torch.tensor([[-0.1, -90.0, -0.2]])
    out = _call(fn, logp, ref)
    finite = bool(torch.isfinite(out).all())
    ok = finite and bool((out >= 0).all()) and float(out[0, 0]) > 1.0
    mistake = ""
    if not finite:
        mistake = ("not finite for a large gap: exp(ref_logp − logp) overflows float32 beyond a gap of ~88.7 nats — clamp the "
                   f"log-ratio (e.g. to [−{CLAMP:g}, {CLAMP:g}], as verl's low_var_kl) before exp — see {SEE}")
    elif not ok:
        mistake = diagnose(out, MISTAKES, (logp, ref), same=_relatively_close) or (
            f"finite, but negative or small for a gap of 100 nats: k3 there is ≥ 0 and large — see {SEE}")
    return Outcome(short(out), ok, mistake)
