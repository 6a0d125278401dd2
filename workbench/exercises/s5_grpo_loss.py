"""Exercise S5 · ``grpo_loss(per_token_loss[B, T], mask[B, T]) -> scalar``: the GRPO paper's per-sequence mean.

Graded by ``workbench.audit.check_aggregation`` with the expected mode ``seq-mean-token-mean``: it measures
the weight each response gets in the loss and names the convention the learner's code implements
(``token-mean``, ``seq-mean-token-sum``, the Dr. GRPO constant normaliser, or weight on padding). Then a
batch with an empty row (finite), and values against the reference.
"""

from __future__ import annotations

import torch

from workbench.audit import check_aggregation
from workbench.exercises.common import CaseFailure, Outcome, close, diagnose, lesson_link, short, tensor_out
from workbench.exercises.course import COURSE
from workbench.exercises.solutions.s5_grpo_loss import grpo_loss as reference  # the reference is the graded solution

EXERCISE = COURSE["s5_grpo_loss"]
SEE = lesson_link(EXERCISE.lesson)

MODE_MISTAKES = {
    "token-mean": "your loss is `token-mean` (TRL bnpo/dapo): a response of length L gets weight L/ΣL, so long responses "
                  f"dominate, instead of 1/B for every response — see {SEE}",
    "seq-mean-token-sum": "your loss is `seq-mean-token-sum`: you sum each response's tokens and average over responses, "
                          f"so a response of length L gets weight L/B instead of 1/B — see {SEE}",
    "seq-mean-token-sum-norm": "your loss divides by a constant (the Dr. GRPO / `seq-mean-token-sum-norm` normaliser, e.g. "
                               "T with padding counted): a response of length L gets weight L/(B·T), not 1/B — divide each "
                               f"response by its own length — see {SEE}",
}

OVER_PADDING = ("normalising over padding: masked positions carry weight in your loss (multiply by the mask before "
                f"summing, divide by the real-token count) — see {SEE}")
CONVENTIONS = {  # the wrong conventions by value, for the cases that compare values: {key: (message, loss(values, mask))}
    "token-mean": (MODE_MISTAKES["token-mean"], lambda v, m: (v * m).sum() / m.sum()),
    "seq-mean-token-sum": (MODE_MISTAKES["seq-mean-token-sum"], lambda v, m: (v * m).sum(-1).mean()),
    "seq-mean-token-sum-norm": (MODE_MISTAKES["seq-mean-token-sum-norm"], lambda v, m: ((v * m).sum(-1) / m.shape[1]).mean()),
    "over-padding": (OVER_PADDING, lambda v, m: v.mean()),
}


def _scalar(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor) and out.numel() == 1:
        out = out.reshape(())
    return tensor_out(out, "a scalar Tensor[]", shape=(), floating=True)


@EXERCISE.add_case("aggregation", "check_aggregation on ragged batches (lengths 1, 3, 5, 8 …)",
                   "seq-mean-token-mean: every response weighs 1/B whatever its length")
def _aggregation(fn) -> Outcome:
    result = check_aggregation(fn, expected="seq-mean-token-mean")
    mode = result.details["mode"]
    problems = result.details.get("problems") or []
    mistake = MODE_MISTAKES.get(mode, "")
    if mode == "unknown" and any("masked positions" in p for p in problems):
        mistake = OVER_PADDING
    elif mode == "unknown" and problems:
        mistake = "; ".join(problems)
    weights = [round(w, 4) for w in result.details["row_weights"]]
    got = f"{mode} (row weights {weights} for lengths {result.details['lengths']})"
    return Outcome(got, mode == "seq-mean-token-mean", mistake, result.details.get("plot"))


@EXERCISE.add_case("empty_rows", "a batch with a fully masked row", "a finite loss (the empty row dropped or adding 0)")
def _empty_rows(fn) -> Outcome:
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
    values = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]])
    out = fn(values, mask)
    if isinstance(out, torch.Tensor) and out.numel() == 1 and not torch.isfinite(out).all():
        raise CaseFailure(f"returned {float(out)}",
                          "0/0 on the empty row: a response with no real token has length 0 — clamp the length at 1 "
                          f"(the row then adds 0) — see {SEE}")
    out = _scalar(out)
    if not torch.isfinite(out):
        raise CaseFailure(f"returned {float(out)}", "0/0 on the empty row: clamp each length at 1")
    dropped = reference(values, mask)
    counted = ((values * mask).sum(-1) / mask.sum(-1).clamp_min(1)).mean()
    ok = close(out, dropped) or close(out, counted)
    mistake = ""
    if not ok:  # a wrong convention by value, or a right one that the empty row upsets
        mistake = diagnose(out, CONVENTIONS, (values, mask))
        if not mistake:
            alone = fn(values[:2].clone(), mask[:2].clone())
            if isinstance(alone, torch.Tensor) and alone.numel() == 1 and close(alone.reshape(()), reference(values[:2], mask[:2])):
                mistake = "the empty row changes the loss of the other rows: leave it out of the mean, or let it add 0"
    return Outcome(f"{float(out):.5g}", ok, mistake)


@EXERCISE.add_case("values", "random per-token losses, lengths 7, 2, 5, 3, 6", "the per-sequence mean of token means")
def _values(fn) -> Outcome:
    generator = torch.Generator().manual_seed(5)
    mask = (torch.arange(7)[None] < torch.tensor([7, 2, 5, 3, 6])[:, None]).float()
    values = torch.randn(5, 7, generator=generator)
    out = _scalar(fn(values.clone(), mask.clone()))
    want = reference(values, mask)
    ok = close(out, want)
    return Outcome(f"{float(out):.6g}", ok, "" if ok else diagnose(out, CONVENTIONS, (values, mask)))


@EXERCISE.add_case("gradient", "backward through the loss (B = 2, lengths 4 and 2)", "gradient 1/(B·L_i) on real tokens, 0 on padding")
def _differentiable(fn) -> Outcome:
    mask = (torch.arange(4)[None] < torch.tensor([4, 2])[:, None]).float()
    with torch.enable_grad():
        values = torch.ones(2, 4, requires_grad=True)
        out = _scalar(fn(values, mask))
        if not out.requires_grad:
            raise CaseFailure("the returned loss has no gradient (requires_grad=False)",
                              "keep the computation in torch (no .item(), .detach() or float()) so the loss can be backpropagated")
        out.backward()
    grad = values.grad if values.grad is not None else torch.zeros(2, 4)
    return Outcome(f"d loss / d per_token_loss = {short(grad)}", close(grad, torch.tensor([[0.125] * 4, [0.25, 0.25, 0, 0]])))
