"""The exercises by name, in course order (the lesson each follows)."""

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

EXERCISES: dict[str, Exercise] = {m.EXERCISE.name: m.EXERCISE for m in (
    s1_position_ids, s2_left_pad, s3_mask_after_eos, s3_generate, s4_dpo_logps, s5_grpo_loss, p6_logprobs, p9_k3, p13_whiten)}


def exercise(name: str) -> Exercise:
    """The exercise called ``name``; an ``InputError`` naming the valid ones otherwise."""
    if name not in EXERCISES:
        raise InputError(f"unknown exercise {name!r}; the exercises are: {', '.join(EXERCISES)}")
    return EXERCISES[name]
