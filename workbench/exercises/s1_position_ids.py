"""Exercise S1 · ``position_ids(attention_mask[B, T]) -> LongTensor[B, T]``: positions that follow the mask.

The first real token of every row is position 0, whatever padding precedes it (``cumsum(mask) − 1``, what
``generate`` does); padding positions are any valid embedding index. Graded on left- and right-padded masks,
valid indices on padding, and by ``workbench.audit.check_position_ids`` on the tiny GPT-2 (learned absolute
positions): the log-probs of a left-padded batch scored with the learner's positions must equal those of each
text alone. The known wrong ones: 0..T−1 whatever the padding (the model default), off by one, −1 on padding,
a cumsum over the batch dimension.
"""

from __future__ import annotations

import torch

from workbench.audit import check_position_ids
from workbench.exercises.common import Outcome, diagnose, lesson_link, tensor_out, tiny_gpt2
from workbench.exercises.course import COURSE
from workbench.exercises.solutions.s1_position_ids import position_ids as reference  # the reference is the graded solution

EXERCISE = COURSE["s1_position_ids"]
SEE = lesson_link(EXERCISE.lesson)


MISTAKES = {
    "arange": ("your positions are 0..T−1 whatever the padding (the model's default): a left-padded row's first real "
               f"token sits at position = its pad count, so an absolute-position model sees shifted positions — see {SEE}",
               lambda m: torch.arange(m.shape[1]).expand(m.shape)),
    "off_by_one": ("off by one: the first real token gets position 1 (cumsum of the mask without − 1); positions start "
                   f"at 0 — see {SEE}", lambda m: m.long().cumsum(-1)),
    "batch_dim": ("cumsum over the batch dimension (dim=0): positions must count along each row (dim=-1)",
                  lambda m: m.long().cumsum(0) - 1),
}


def _same_on_real(mask):
    def same(a, b):
        keep = mask.bool()
        return isinstance(a, torch.Tensor) and a.shape == b.shape and bool((a.long()[keep] == b.long()[keep]).all())
    return same


def _positions_case(name: str, what: str, rows: list[list[int]]) -> None:
    """Declare case ``name`` on the mask ``rows``: the real tokens of every row at positions 0, 1, 2, …"""

    def run(fn) -> Outcome:
        mask = torch.tensor(rows)
        out = tensor_out(fn(mask.clone()), "a LongTensor[B, T] of positions", shape=tuple(mask.shape), floating=False)
        keep = mask.bool()
        want = reference(mask)
        ok = bool((out[keep] == want[keep]).all())
        shown = torch.where(keep, out, torch.full_like(out, -99)).tolist()
        got = str(shown).replace("-99", "·")
        return Outcome(got + "  (· = padding)", ok, "" if ok else diagnose(out, MISTAKES, (mask,), same=_same_on_real(mask)))

    EXERCISE.add_case(name, f"{what} {str(rows).replace(' ', '')}", "real tokens at 0, 1, 2, … in every row", run)


_positions_case("left_padded", "a left-padded mask", [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
_positions_case("right_padded", "a right-padded mask", [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])


@EXERCISE.add_case("valid_on_padding", "a left-padded mask", "every position a valid embedding index (0 ≤ p < 256)")
def _valid_on_padding(fn) -> Outcome:
    mask = torch.tensor([[0, 0, 0, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    out = tensor_out(fn(mask.clone()), "a LongTensor[B, T] of positions", shape=(3, 5), floating=False)
    low, high = int(out.min()), int(out.max())
    ok = low >= 0 and high < 256
    mistake = "" if ok else ("padding positions are −1 (cumsum(mask) − 1 before the first real token): an embedding lookup "
                             "at −1 fails or wraps around — fill them with a valid index (clamp at 0, or 1 as Hugging Face does)")
    return Outcome(f"min {low}, max {high}", ok, mistake)


def _logprob_fn(position_ids_fn):
    def logprob_fn(model, input_ids, attention_mask):
        positions = tensor_out(position_ids_fn(attention_mask.clone()), "a LongTensor[B, T] of positions",
                               shape=tuple(attention_mask.shape), floating=False)
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions.clamp(0, 255)).logits
        return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return logprob_fn


@EXERCISE.add_case("log_probs", "check_position_ids on the tiny GPT-2 (learned absolute positions)",
                   "log-probs of left-padded, right-padded and unpadded texts equal (mask-derived)")
def _log_probs(fn) -> Outcome:
    model, tokenizer = tiny_gpt2()
    result = check_position_ids(_logprob_fn(fn), model, tokenizer)
    mistake = ""
    if not result.passed:
        probe = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
        out = fn(probe.clone())
        mistake = diagnose(out, MISTAKES, (probe,), same=_same_on_real(probe)) or \
            f"positions that do not follow the mask change the log-probs of padded rows — see {SEE}"
    got = f"{result.convention}: max |Δ log p| {result.details['max_abs_gap']:.3g} nats (tolerance {result.details['tolerance']:g})"
    return Outcome(got, result.passed, mistake, result.details.get("plot"))

