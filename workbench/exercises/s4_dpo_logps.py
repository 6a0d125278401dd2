"""Exercise S4 · ``dpo_logps(token_logps[2B, T-1], attention_mask[2B, T], prompt_lengths[B]) -> [2B]``.

Each row's sequence log-prob over its *response* tokens: rows 0..B−1 are prompt+chosen, rows B..2B−1
prompt+rejected of the same B prompts (right-padded); ``token_logps[r, t]`` is log p of token t+1, so the
response targets of a row with prompt length P are t ≥ P − 1. Graded by ``workbench.audit.check_dpo_mask``
(which rows count which targets: prompt tokens on no row, no padding, every response token) and on values.
The known wrong ones: the zip over B prompt lengths for 2B rows (rejected prompts kept, the OpenRLHF bug), no
prompt masking, an off-by-one at the prompt boundary, padding counted, a mean instead of a sum.
"""

from __future__ import annotations

import torch

from workbench.audit import check_dpo_mask
from workbench.audit.dpo import crafted_batch
from workbench.exercises.common import Outcome, close, lesson_link, short, tensor_out
from workbench.exercises.course import COURSE
from workbench.exercises.solutions.s4_dpo_logps import dpo_logps as reference  # the reference is the graded solution

EXERCISE = COURSE["s4_dpo_logps"]
SEE = lesson_link(EXERCISE.lesson)


def _mistake(details: dict) -> str:
    counted = details["prompt_tokens_counted"]
    by_row = details["prompt_tokens_by_row"]
    b = len(details["prompt_lengths"])
    prompt_targets = [p - 1 for p in details["prompt_lengths"]] * 2
    if counted["chosen"] == 0 and counted["rejected"] > 0:
        return ("the prompts of the rejected rows are counted: a zip over the B prompt lengths for 2B rows masks only the "
                f"chosen half (the OpenRLHF bug) — repeat prompt_lengths for both halves — see {SEE}")
    if by_row == prompt_targets:
        return f"no prompt masking: every row's sequence log-prob includes its prompt tokens — see {SEE}"
    if by_row == [1] * (2 * b):
        return ("off by one at the prompt boundary: token_logps[:, t] scores token t+1, so the last prompt target is "
                f"t = P − 2 and the response starts at t = P − 1 — see {SEE}")
    if details["padding_tokens_counted"]:
        return "padding targets are counted: multiply by the attention mask shifted by one (attention_mask[:, 1:])"
    if details["response_reduction"] == "mean":
        return ("you average over the response tokens: DPO's sequence log-prob is a sum (a mean rescales each pair's "
                f"margin by its length) — see {SEE}")
    if "some response tokens are not counted" in details.get("convention", ""):
        return ("the first response token is dropped: off by one at the prompt boundary (mask t < P − 1, not t < P) — "
                f"see {SEE}")
    return ""


@EXERCISE.add_case("prompt_mask", "check_dpo_mask: one-hot token log-probs on a crafted [chosen; rejected] batch",
                   "no prompt or padding target counted on any row, every response target counted once (a sum)")
def _mask_check(fn) -> Outcome:
    result = check_dpo_mask(fn)
    details = dict(result.details, convention=result.convention)
    ok = result.passed and details["response_reduction"] == "sum"
    counted = details["prompt_tokens_counted"]
    got = (f"{result.convention}; prompt targets counted: chosen {counted['chosen']}, rejected {counted['rejected']}; "
           f"padding targets {details['padding_tokens_counted']}; response reduction {details['response_reduction']}")
    return Outcome(got, ok, "" if ok else _mistake(details), details.get("plot"))


@EXERCISE.add_case("values", "random token log-probs, prompt lengths 3, 1, 2, 4", "Σ over each row's response targets")
def _values(fn) -> Outcome:
    prompts, chosen, rejected = [3, 1, 2, 4], [2, 4, 3, 1], [5, 1, 2, 3]
    mask = crafted_batch(prompts, chosen, rejected)
    generator = torch.Generator().manual_seed(4)
    token_logps = -torch.rand(mask.shape[0], mask.shape[1] - 1, generator=generator) * 4
    out = tensor_out(fn(token_logps.clone(), mask.clone(), list(prompts)), "a Tensor[2B] of sequence log-probs",
                     shape=(mask.shape[0],), floating=True)
    want = reference(token_logps, mask, prompts)
    return Outcome(short(out), close(out, want), "")
