"""The exercises by name, in course order (the lesson each follows): ``course.COURSE`` with every case added.

Importing an exercise module adds its cases to its ``COURSE`` entry, so this module imports them all before anyone
grades; ``exercise(name)`` looks one up with a clear error.
"""

from __future__ import annotations

from workbench.core.errors import InputError
from workbench.exercises import (
    p6_logprobs,
    p9_k3,
    p13_whiten,
    s1_position_ids,
    s2_left_pad,
    s3_generate,
    s3_mask_after_eos,
    s4_dpo_logps,
    s5_grpo_loss,
)
from workbench.exercises.common import Exercise
from workbench.exercises.course import COURSE

CASE_MODULES = (s1_position_ids, s2_left_pad, s3_mask_after_eos, s3_generate, s4_dpo_logps, s5_grpo_loss, p6_logprobs, p9_k3,
                p13_whiten)  # each adds the cases of ``COURSE[<its name>]`` on import
EXERCISES: dict[str, Exercise] = dict(COURSE)


def exercise(name: str) -> Exercise:
    """The exercise called ``name``; an ``InputError`` naming the valid ones otherwise."""
    if name not in EXERCISES:
        raise InputError(f"unknown exercise {name!r}; the exercises are: {', '.join(EXERCISES)}")
    return EXERCISES[name]
