"""``check_old_logprob_guard``: does your trainer keep a generation-time π_old whenever an optimiser step splits a
generation batch (P27)?

::

    needs_old_logprobs(steps_per_generation: int, gradient_accumulation_steps: int, num_iterations: int) -> bool

returns whether your trainer computes π_old when it generates (True) or lets the loss use the current log-probs,
detached (False). A generation batch feeds ``steps_per_generation × num_iterations`` micro-steps; the optimiser steps
after every ``gradient_accumulation_steps``-th micro-step. When a step falls *inside* a generation batch, the micro-steps
after it train a newer policy on older samples, and a detached π_old makes their ratio exactly 1. The check lays the
schedule out micro-step by micro-step for every setting up to ``largest`` and compares your answer with it.

TRL 0.18–0.19 answered ``num_iterations > 1 or steps_per_generation > gradient_accumulation_steps``: it misses
``steps_per_generation < GA`` with GA not a multiple of it (3 and 4: TRL PR #3493). TRL ≥ 0.20 answers
``GA % (steps_per_generation × num_iterations) != 0``, exactly the split settings. Answering True where no batch is
split is correct too (one extra forward pass); the check reports those settings without failing.
"""

from __future__ import annotations

import math

from workbench.audit.result import AuditResult
from workbench.audit.signatures import first_call, require_signature

EXPECTED = "needs_old_logprobs(steps_per_generation: int, gradient_accumulation_steps: int, num_iterations: int) -> bool"


def batch_is_split(steps_per_generation: int, gradient_accumulation_steps: int, num_iterations: int = 1) -> bool:
    """Whether some optimiser step falls strictly inside a generation batch, over one period of the schedule."""
    every = steps_per_generation * num_iterations
    period = math.lcm(every, gradient_accumulation_steps)
    # the optimiser steps after micro-step t when (t + 1) % GA == 0; it splits a batch unless t is the batch's last
    return any((t + 1) % gradient_accumulation_steps == 0 and (t + 1) % every != 0 for t in range(period))


def check_old_logprob_guard(needs_old_logprobs, *, largest: int = 8, iterations: tuple[int, ...] = (1, 2)) -> AuditResult:
    """P27: the settings (steps_per_generation, GA ≤ ``largest``; num_iterations in ``iterations``) where a batch is split
    but ``needs_old_logprobs`` says False (module doc).

    ``details``: ``missed`` (those settings, the metric's count), ``extra`` (snapshots where nothing is split: correct,
    one forward more), ``settings`` (how many were asked).
    """
    require_signature(needs_old_logprobs, "check_old_logprob_guard", EXPECTED, 3)
    missed, extra, checked = [], [], 0
    for iters in iterations:
        for spg in range(1, largest + 1):
            for ga in range(1, largest + 1):
                answer = first_call(needs_old_logprobs, "check_old_logprob_guard", EXPECTED, spg, ga, iters)
                if not isinstance(answer, bool):
                    answer = bool(answer)  # numpy/torch booleans and 0/1 count
                split, checked = batch_is_split(spg, ga, iters), checked + 1
                if split and not answer:
                    missed.append([spg, ga, iters])
                elif answer and not split:
                    extra.append([spg, ga, iters])
    passed = not missed
    if passed:
        convention = ("π_old from generation time whenever an optimiser step splits a generation batch"
                      + (f" (and in {len(extra)} unsplit settings: an extra forward, correct)" if extra else " (TRL ≥ 0.20)"))
    elif all(spg < ga and ga % spg and iters == 1 for spg, ga, iters in missed):
        convention = ("ratio ≡ 1 on the remainder: steps_per_generation < GA with GA not a multiple of it is trained "
                      "after optimizer.step() with the current log-probs (TRL 0.18–0.19's guard, PR #3493)")
    else:
        convention = f"ratio ≡ 1 on the micro-steps after an optimiser step in {len(missed)} split settings"
    by_iterations = {f"num_iterations {i}": [sum(1 for m in missed if m[2] == i)] for i in iterations}
    details = {"metric": "split settings without a generation-time π_old", "value": len(missed), "missed": missed,
               "extra": extra, "settings": checked, "largest": largest,
               "plot": {"kind": "bar", "x": ["missed settings"], "series": by_iterations, "xlabel": f"steps_per_generation, GA ≤ {largest}",
                        "ylabel": "split settings with ratio ≡ 1", "title": convention}}
    return AuditResult("old_logprob_guard", passed, convention, details)
