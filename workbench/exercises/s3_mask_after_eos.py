"""Exercise S3 · ``mask_after_eos(response_ids[B, R], stop_ids) -> mask[B, R]``: 1 up to and including the first stop id.

Pure cases (no model): one stop id at different positions, several stop ids, a row that never stops, a stop
at position 0, a repeated stop. Known wrong conventions are recognised by running them on the same inputs:
masking the stop token itself (before instead of after EOS), honouring only the first stop id, cutting at the
last stop, the ``argmax`` of an all-False row (a row without stop cut at 0), the inverted mask.
"""

from __future__ import annotations

import torch

from workbench.exercises.common import CaseSpec, Exercise, Outcome, diagnose, lesson_link, tensor_out
from workbench.exercises.solutions.s3_mask_after_eos import mask_after_eos as reference  # the reference is the graded solution

LESSON = "03_eos_termination"
SEE = lesson_link(LESSON)
EOS, STOP2, PAD = 2, 9, 0


def _before(ids, stop_ids):
    is_stop = torch.isin(ids, torch.tensor(stop_ids))
    return (is_stop.long().cumsum(-1) == 0).long()


def _first_id_only(ids, stop_ids):
    return reference(ids, stop_ids[:1])


def _last_stop(ids, stop_ids):
    is_stop = torch.isin(ids, torch.tensor(stop_ids)).long()
    after_last = is_stop.flip(-1).cumsum(-1).flip(-1)
    return ((after_last > 0) | (is_stop.sum(-1, keepdim=True) == 0)).long()


def _argmax(ids, stop_ids):
    first = torch.isin(ids, torch.tensor(stop_ids)).long().argmax(-1)
    return (torch.arange(ids.shape[1])[None] <= first[:, None]).long()


def _inverted(ids, stop_ids):
    return 1 - reference(ids, stop_ids)


MISTAKES = {
    "before": ("masking before instead of after EOS: your mask drops the stop token itself, so the policy is never "
               f"trained on the action that ends the response (it learns not to stop) — see {SEE}", _before),
    "first_id": ("only the first stop id is honoured: a response ending with another stop id (e.g. <|im_end|> besides "
                 f"<eos>) runs on in the mask — use every id of stop_ids (torch.isin) — see {SEE}", _first_id_only),
    "last": (f"cut at the last stop id instead of the first: tokens between two stops stay in the mask — see {SEE}", _last_stop),
    "argmax": ("a row with no stop id is cut at position 0: argmax of an all-False row is 0 — a response that never "
               f"stopped (truncated) keeps all its tokens — see {SEE}", _argmax),
    "inverted": ("your mask is inverted: 1 after the stop, 0 on the response", _inverted),
}


def _same(a, b) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and bool((a.long() == b.long()).all())


def _case(ids: list[list[int]], stop_ids: list[int]):
    def run(fn) -> Outcome:
        x = torch.tensor(ids)
        out = tensor_out(fn(x.clone(), list(stop_ids)), "a mask Tensor[B, R] of 0/1", shape=tuple(x.shape))
        if out.dtype != torch.bool and not bool(((out == 0) | (out == 1)).all()):
            return Outcome(f"values other than 0 and 1: {out.tolist()}", False, "a mask holds 0 and 1 only")
        want = reference(x, stop_ids)
        ok = _same(out, want)
        return Outcome(str(out.long().tolist()), ok, "" if ok else diagnose(out, MISTAKES, (x, stop_ids), same=_same))
    return run



EXERCISE = Exercise(
    name="s3_mask_after_eos", function="mask_after_eos", lesson=LESSON,
    signature="mask_after_eos(response_ids: LongTensor[B, R], stop_ids: list[int]) -> Tensor[B, R]",
    summary="the loss mask of sampled responses: 1 up to and including the first stop id, 0 after",
    cases=[
        CaseSpec("one_stop", f"stop_ids=[{EOS}], rows stopping at positions 3 and 1",
                 str(reference(torch.tensor([[5, 6, 7, EOS, 8, 8], [5, EOS, 8, 8, 8, 8]]), [EOS]).tolist()),
                 _case([[5, 6, 7, EOS, 8, 8], [5, EOS, 8, 8, 8, 8]], [EOS])),
        CaseSpec("several_stop_ids", f"stop_ids=[{EOS}, {STOP2}], one row ends with each",
                 str(reference(torch.tensor([[5, STOP2, 7, 7, 7], [5, 6, EOS, 7, 7]]), [EOS, STOP2]).tolist()),
                 _case([[5, STOP2, 7, 7, 7], [5, 6, EOS, 7, 7]], [EOS, STOP2])),
        CaseSpec("no_stop", "a row that never produces a stop id (truncated at R) beside one that does",
                 str(reference(torch.tensor([[5, 6, 7, 8, 3], [5, EOS, 7, 7, 7]]), [EOS]).tolist()),
                 _case([[5, 6, 7, 8, 3], [5, EOS, 7, 7, 7]], [EOS])),
        CaseSpec("stop_at_0", "a row whose first token is the stop id",
                 str(reference(torch.tensor([[EOS, 6, 7, 8], [5, 6, EOS, 8]]), [EOS]).tolist()),
                 _case([[EOS, 6, 7, 8], [5, 6, EOS, 8]], [EOS])),
        CaseSpec("repeated_stop", "two stop ids in one row (and padding equal to neither)",
                 str(reference(torch.tensor([[5, EOS, 6, EOS, PAD], [EOS, EOS, PAD, PAD, PAD]]), [EOS]).tolist()),
                 _case([[5, EOS, 6, EOS, PAD], [EOS, EOS, PAD, PAD, PAD]], [EOS])),
    ],
)
