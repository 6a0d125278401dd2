"""Exercise S3 · ``generate(model, input_ids, attention_mask, max_new_tokens, stop_ids) -> ids[B, T+R]``.

A batched decoding loop that stops once every row has produced one of ``stop_ids``, and fills a finished row
with ``model.config.pad_token_id`` afterwards. Graded by ``workbench.audit.check_eos_stopping``, which forces
the model (a forward hook) so that row i emits i+1 filler tokens then EOS, and counts forwards: decoding steps
taken vs needed, where the stop landed, and tokens after it; once with ``stop_ids=[eos]``, once with EOS as the
second of two stop ids. The known wrong ones: no stopping (runs to ``max_new_tokens``), stopping when the first
row finishes, finished rows that keep generating, only the first stop id honoured.
"""

from __future__ import annotations

import functools

from workbench.audit import check_eos_stopping
from workbench.exercises.common import Outcome, lesson_link, tiny_gpt2
from workbench.exercises.course import COURSE

EXERCISE = COURSE["s3_generate"]
SEE = lesson_link(EXERCISE.lesson)
OTHER_STOP = 40  # a stop id the forced model never emits (a letter of the character tokenizer)


def _mistake(result, two_ids: bool) -> str:
    d = result.details
    convention = result.convention
    if convention.startswith("runs to max_new_tokens"):
        if two_ids:
            return ("only the first stop id is honoured: EOS was the second id of stop_ids and your loop ran on — "
                    f"a row is finished when its token is in stop_ids (torch.isin) — see {SEE}")
        return ("no EOS stopping: your loop runs to max_new_tokens after every row has finished, wasting "
                f"{d['wasted_steps']} decoding steps here — stop when every row has produced a stop id — see {SEE}")
    if convention.startswith("stops late"):
        return (f"stops late: {d['wasted_steps']} decoding steps after the last row finished — check the stop condition "
                f"right after appending each token — see {SEE}")
    if convention.startswith("did not emit") and d["forwards"] < d["longest_needed"]:
        return ("stops when the first row finishes: the other rows are cut before their stop id — stop when *all* rows "
                "are finished (finished.all()), not any")
    if convention.startswith("did not emit"):
        return "the rows did not end where the model put its stop: take the argmax of the last position's logits each step"
    return ""


@functools.lru_cache(maxsize=4)  # the first two cases read the same forced run of the same function
def _run(fn, stop_ids):
    model, tokenizer = tiny_gpt2()
    eos = tokenizer.eos_token_id
    ids = [OTHER_STOP, eos] if stop_ids == "two" else [eos]
    return check_eos_stopping(lambda m, i, a, n: fn(m, i, a, n, list(ids)), model, tokenizer)


@EXERCISE.add_case("stops_at_eos", "check_eos_stopping: rows forced to stop after 1, 2, 3, 4 tokens, max_new_tokens 16",
                   "4 + 1 = 5 decoding steps, each row's EOS where the model put it")
def _stops(fn) -> Outcome:
    result = _run(fn, "one")
    d = result.details
    got = f"{result.convention}: {d['forwards']} forwards for {d['longest_needed']} needed, stops at {d['eos_positions']}"
    return Outcome(got, result.passed, "" if result.passed else _mistake(result, False), d.get("plot"))


@EXERCISE.add_case("pads_after_stop", "the same forced batch", "only padding after each row's stop")
def _pads(fn) -> Outcome:
    result = _run(fn, "one")
    d = result.details
    followed = not result.convention.startswith("did not emit")
    ok = followed and d["non_pad_tokens_after_eos"] == 0
    mistake = ""
    if not followed:
        mistake = _mistake(result, False)
    elif not ok:
        mistake = ("finished rows keep generating: tokens after a row's stop id are not padding — replace the next token "
                   f"of a finished row by model.config.pad_token_id (a loss mask would otherwise need them cut) — see {SEE}")
    return Outcome(f"{d['non_pad_tokens_after_eos']} non-pad tokens after the stops", ok, mistake)


@EXERCISE.add_case("second_stop_id", f"stop_ids=[{OTHER_STOP}, eos]: EOS is the second stop id", "stops at EOS as before")
def _second_stop_id(fn) -> Outcome:
    result = _run(fn, "two")
    d = result.details
    got = f"{result.convention}: {d['forwards']} forwards for {d['longest_needed']} needed"
    return Outcome(got, result.passed, "" if result.passed else _mistake(result, True))
