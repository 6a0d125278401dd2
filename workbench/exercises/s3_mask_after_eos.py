"""Exercise S3 · ``mask_after_eos(response_ids[B, R], stop_ids) -> mask[B, R]``: 1 up to and including the first stop id.

Pure cases (no model): one stop id at different positions, several stop ids, a row that never stops, a stop
at position 0, a repeated stop. Known wrong conventions are recognised by running them on the same inputs:
masking the stop token itself (before instead of after EOS), honouring only the first stop id, cutting at the
last stop, the ``argmax`` of an all-False row (a row without stop cut at 0), the inverted mask.
"""

from __future__ import annotations

import torch

from workbench.exercises.common import Outcome, diagnose, lesson_link, tensor_out
from workbench.exercises.course import COURSE
from workbench.exercises.solutions.s3_mask_after_eos import mask_after_eos as reference  # the reference is the graded solution

EXERCISE = COURSE["s3_mask_after_eos"]
SEE = lesson_link(EXERCISE.lesson)
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


def _case(name: str, tried: str, ids: list[list[int]], stop_ids: list[int]) -> None:
    """Declare case ``name`` on the responses ``ids``: the expected mask is the reference's on them."""

    def run(fn) -> Outcome:
        x = torch.tensor(ids)
        out = tensor_out(fn(x.clone(), list(stop_ids)), "a mask Tensor[B, R] of 0/1", shape=tuple(x.shape))
        if out.dtype != torch.bool and not bool(((out == 0) | (out == 1)).all()):
            return Outcome(f"values other than 0 and 1: {out.tolist()}", False, "a mask holds 0 and 1 only")
        want = reference(x, stop_ids)
        ok = _same(out, want)
        return Outcome(str(out.long().tolist()), ok, "" if ok else diagnose(out, MISTAKES, (x, stop_ids), same=_same))

    EXERCISE.add_case(name, tried, str(reference(torch.tensor(ids), stop_ids).tolist()), run)


_case("one_stop", f"stop_ids=[{EOS}], rows stopping at positions 3 and 1", [[5, 6, 7, EOS, 8, 8], [5, EOS, 8, 8, 8, 8]], [EOS])
_case("several_stop_ids", f"stop_ids=[{EOS}, {STOP2}], one row ends with each", [[5, STOP2, 7, 7, 7], [5, 6, EOS, 7, 7]], [EOS, STOP2])
_case("no_stop", "a row that never produces a stop id (truncated at R) beside one that does", [[5, 6, 7, 8, 3], [5, EOS, 7, 7, 7]], [EOS])
_case("stop_at_0", "a row whose first token is the stop id", [[EOS, 6, 7, 8], [5, 6, EOS, 8]], [EOS])
_case("repeated_stop", "two stop ids in one row (and padding equal to neither)", [[5, EOS, 6, EOS, PAD], [EOS, EOS, PAD, PAD, PAD]], [EOS])

