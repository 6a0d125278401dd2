"""Exercise P6 · ``logprobs(logits[B, T, V], ids[B, T], temperature) -> [B, T]``: log-probs of the sampling distribution.

``logits[:, t]`` scores ``ids[:, t]`` (the caller has already shifted them). A trainer's recomputed log-probs
must be those of the distribution the tokens were sampled from, softmax(logits / τ), in float32 even when the
model runs in bf16. Graded by ``workbench.audit.check_temperature`` on the tiny GPT-2 at τ = 0.7 (which also
estimates the temperature the function applies), on values, and on bf16 logits. The known wrong ones: no
temperature, multiplying by τ, probabilities instead of log-probs, no upcast before dividing by τ.
"""

from __future__ import annotations

import torch

from workbench.audit import check_temperature
from workbench.exercises.common import Outcome, close, diagnose, lesson_link, short, tensor_out, tiny_gpt2
from workbench.exercises.course import COURSE

EXERCISE = COURSE["p6_logprobs"]
SEE = lesson_link(EXERCISE.lesson)
TAU = 0.7


def reference(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(logits.double() / temperature, -1).gather(-1, ids[..., None]).squeeze(-1)


def _gather(logp, ids):
    return logp.gather(-1, ids[..., None]).squeeze(-1)


MISTAKES = {
    "no_temperature": ("no temperature: your log-probs are those of softmax(logits), not of the sampling distribution "
                       f"softmax(logits / τ), so the ratio is off from the first step — see {SEE}",
                       lambda lg, ids, tau: _gather(torch.log_softmax(lg.float(), -1), ids)),
    "multiply": ("you multiply the logits by τ instead of dividing: at τ < 1 the distribution is flattened instead of "
                 f"sharpened — see {SEE}", lambda lg, ids, tau: _gather(torch.log_softmax(lg.float() * tau, -1), ids)),
    "probabilities": ("you return probabilities (softmax), not log-probabilities (log_softmax)",
                      lambda lg, ids, tau: _gather(torch.softmax(lg.float() / tau, -1), ids)),
    "no_upcast": ("no upcast before dividing by τ: bf16 keeps 8 bits of mantissa, so logits / τ and the log_softmax round "
                  f"by ~0.4 % — call .float() on the logits first and return float32 — see {SEE}",
                  lambda lg, ids, tau: _gather(torch.log_softmax(lg / tau, -1), ids)),
}


def _call(fn, logits, ids, tau):
    return tensor_out(fn(logits.clone(), ids.clone(), tau), "a Tensor[B, T] of log-probs", shape=tuple(ids.shape),
                      floating=True)


@EXERCISE.add_case("temperature", f"check_temperature on the tiny GPT-2 at τ = {TAU}", f"log-probs of softmax(logits / {TAU})")
def _temperature(fn) -> Outcome:
    model, tokenizer = tiny_gpt2()

    def logprob_fn(model, input_ids, attention_mask):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
        return _call(fn, logits, input_ids[:, 1:], TAU)

    result = check_temperature(logprob_fn, model, tokenizer, TAU)
    d = result.details
    got = f"{result.convention}; the function matches τ ≈ {d['effective_temperature']:.3g}"
    mistake = ""
    if not result.passed:
        effective = d["effective_temperature"]
        if d["max_abs_gap_at_1"] <= d["tolerance"]:
            mistake = MISTAKES["no_temperature"][0]
        elif abs(effective - 1 / TAU) < 0.02:
            mistake = MISTAKES["multiply"][0]
        else:
            mistake = f"your log-probs match no temperature (best τ ≈ {effective:.3g}) — see {SEE}"
    return Outcome(got, result.passed, mistake, d.get("plot"))


@EXERCISE.add_case("values", "random float32 logits, τ = 1.5", "log_softmax(logits / τ) at ids")
def _values(fn) -> Outcome:
    generator = torch.Generator().manual_seed(6)
    logits = torch.randn(2, 5, 11, generator=generator) * 3
    ids = torch.randint(0, 11, (2, 5), generator=generator)
    out = _call(fn, logits, ids, 1.5)
    ok = close(out, reference(logits, ids, 1.5), atol=1e-5, rtol=1e-5)
    return Outcome(short(out[0]), ok, "" if ok else diagnose(out, MISTAKES, (logits, ids, 1.5), same=close))


@EXERCISE.add_case("bf16", f"bf16 logits of scale 6, τ = {TAU}", "float32 log-probs within 1e-3 nats of float64")
def _bf16(fn) -> Outcome:
    generator = torch.Generator().manual_seed(7)
    logits = (torch.randn(4, 16, 64, generator=generator) * 6).bfloat16()
    ids = torch.randint(0, 64, (4, 16), generator=generator)
    out = _call(fn, logits, ids, TAU)
    want = reference(logits, ids, TAU)
    gap = float((out.double() - want).abs().max())
    ok = gap < 1e-3 and out.dtype in (torch.float32, torch.float64)
    mistake = ""
    if not ok:
        same = lambda a, b: close(a, b, atol=1e-6, rtol=1e-6)  # noqa: E731 - bitwise-close to the wrong path
        mistake = diagnose(out, MISTAKES, (logits, ids, TAU), same=same) or (
            MISTAKES["no_upcast"][0] if out.dtype in (torch.bfloat16, torch.float16) or gap >= 1e-3 else "")
    return Outcome(f"dtype {str(out.dtype).replace('torch.', '')}, max |error| {gap:.3g} nats vs float64", ok, mistake)
