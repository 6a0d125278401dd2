"""Exercise S2 · ``left_pad(input_ids[B, T], attention_mask[B, T], pad_id) -> (input_ids, attention_mask)``.

Turns a right-padded batch into a left-padded one, so that every row's last real token sits in the last
column (where batched, cached generation appends the next token). Graded on the tokens of each row (same, in
order), the mask, the pad id, a batch without padding, and by generation: greedy ``generate`` of the tiny GPT-2
on the learner's batch must equal generating each row alone. The known wrong ones: the batch returned
unchanged, each row reversed (``flip``), the mask left behind, padding filled with 0 instead of ``pad_id``.
"""

from __future__ import annotations

import torch

from workbench.exercises.common import CaseFailure, Outcome, diagnose, lesson_link, tiny_gpt2
from workbench.exercises.course import COURSE
from workbench.exercises.solutions.s2_left_pad import left_pad as reference  # the reference is the graded solution

EXERCISE = COURSE["s2_left_pad"]
SEE = lesson_link(EXERCISE.lesson)
PAD = 7


MISTAKES = {
    "unchanged": (f"the batch comes back unchanged: still right-padded — move each row's real tokens to the end — see {SEE}",
                  lambda ids, mask, pad: (ids, mask)),
    "flip": ("you reversed each row (flip): the padding moves left but the tokens come out in reverse order — shift "
             "(roll) each row by its pad count instead", lambda ids, mask, pad: (ids.flip(-1), mask.flip(-1))),
    "mask": ("the attention mask was not moved with the tokens: it still marks the old (right-padded) positions",
             lambda ids, mask, pad: (reference(ids, mask, pad)[0], mask)),
    "pad_id": ("the padding holds 0, not pad_id: use the pad id you are given",
               lambda ids, mask, pad: (reference(ids, mask, pad)[0].masked_fill(reference(ids, mask, pad)[1] == 0, 0),
                                       reference(ids, mask, pad)[1])),
}


def _pair(out, shape):
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise CaseFailure(f"returned {type(out).__name__}, expected a tuple (input_ids, attention_mask)",
                          "return both tensors: return ids, mask")
    ids, mask = out
    for name, t in (("input_ids", ids), ("attention_mask", mask)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape):
            raise CaseFailure(f"{name}: {type(t).__name__} {tuple(getattr(t, 'shape', ()))}, expected a Tensor of shape {tuple(shape)}")
    return ids.long(), mask.long()


def _same(a, b) -> bool:
    return all(torch.equal(x.long(), y.long()) for x, y in zip(a, b, strict=True))


def _batch_case(ids_rows, mask_rows, what: str):
    def run(fn) -> Outcome:
        ids, mask = torch.tensor(ids_rows), torch.tensor(mask_rows)
        out = _pair(fn(ids.clone(), mask.clone(), PAD), ids.shape)
        want = reference(ids, mask, PAD)
        if what == "tokens":  # tokens and mask; the value in padding slots is the next case's business
            ok = torch.equal(out[1], want[1]) and torch.equal(out[0][want[1].bool()], want[0][want[1].bool()])
        else:
            ok = _same(out, want)
        mistake = "" if ok else diagnose(out, MISTAKES, (ids, mask, PAD), same=_same)
        return Outcome(f"ids {out[0].tolist()}, mask {out[1].tolist()}", ok, mistake)
    return run


RIGHT_IDS = [[11, 12, 13, 14], [21, 22, PAD, PAD], [31, PAD, PAD, PAD]]
RIGHT_MASK = [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]
LEFT_MASK = reference(torch.tensor(RIGHT_IDS), torch.tensor(RIGHT_MASK), PAD)[1].tolist()
EXERCISE.add_case("tokens", f"a right-padded batch {RIGHT_IDS} (pad_id {PAD})",
                  f"each row's tokens in order at the right end, mask {LEFT_MASK}", _batch_case(RIGHT_IDS, RIGHT_MASK, "tokens"))
EXERCISE.add_case("pad_id", f"the same batch, pad_id {PAD}", f"padding slots hold {PAD}", _batch_case(RIGHT_IDS, RIGHT_MASK, "all"))
EXERCISE.add_case("no_padding", "a batch without padding", "unchanged",
                  _batch_case([[1, 2, 3], [4, 5, 6]], [[1, 1, 1], [1, 1, 1]], "all"))

TEXTS = ("12+34=", "5*5=", "1+2=")


@EXERCISE.add_case("generation", "greedy generate (5 tokens) of the tiny GPT-2 on your batch vs each row alone",
                   "the same tokens for every row")
def _generation(fn) -> Outcome:
    model, tokenizer = tiny_gpt2()
    pad = tokenizer.pad_token_id
    rows = [list(tokenizer(t)["input_ids"]) for t in TEXTS]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    left_ids, left_mask = _pair(fn(ids.clone(), mask.clone(), pad), ids.shape)
    settings = dict(max_new_tokens=5, do_sample=False, pad_token_id=pad, eos_token_id=None)
    batched = model.generate(input_ids=left_ids, attention_mask=left_mask, **settings)[:, width:]
    alone = [model.generate(input_ids=torch.tensor([r]), attention_mask=torch.ones(1, len(r), dtype=torch.long),
                            **settings)[0, len(r):] for r in rows]
    same = [torch.equal(b, a) for b, a in zip(batched, alone, strict=True)]
    ok = all(same)
    mistake = "" if ok else f"rows whose real tokens do not end in the last column generate after padding — see {SEE}"
    return Outcome(f"rows equal to generating alone: {same}", ok, mistake)

