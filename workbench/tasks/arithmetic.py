"""The task: digit arithmetic with a verifiable reward.

Prompts look like ``"47+8="`` and the correct response is the answer followed by EOS
(``"55<eos>"``). Operands have 1–2 digits and the operators are ``+``, ``-`` (results may be
negative) and ``*`` (single digits), so prompts span 4–6 characters and answers 1–3 characters:
enough spread in lengths for the length-dependent pitfalls (S3, S4, S5) to show.

The reward is verifiable: 1.0 for exactly the right answer ended by EOS, else 0.0 (a truncated
response with no EOS also scores 0 here; trainers add their own missing-EOS penalty on top).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One question: ``prompt`` (e.g. ``"47+8="``), its correct response ``answer`` (``"55"``; the text SFT
    trains on and a preference pair's chosen side) and the ``task`` it belongs to (``"arith"`` here,
    ``"sums"`` for ``tasks.sums``, ``"restate"`` for ``tasks.restate``; ``tasks.registry.reward`` scores a response by it)."""

    prompt: str
    answer: str
    task: str = "arith"


def all_problems() -> list[Problem]:
    """Every problem of the task, in a fixed order (≈ 20 000)."""
    problems = []
    for a in range(100):
        for b in range(100):
            problems.append(Problem(f"{a}+{b}=", str(a + b)))
            problems.append(Problem(f"{a}-{b}=", str(a - b)))
    for a in range(10):
        for b in range(10):
            problems.append(Problem(f"{a}*{b}=", str(a * b)))
    return problems


def split_problems(test_fraction: float = 0.1, seed: int = 0) -> tuple[list[Problem], list[Problem]]:
    """A fixed, disjoint train/test split."""
    problems = all_problems()
    random.Random(seed).shuffle(problems)
    n_test = int(len(problems) * test_fraction)
    return problems[n_test:], problems[:n_test]


def wrong_answer(problem: Problem, rng: random.Random) -> str:
    """A plausible wrong answer, sometimes of a different length than the right one."""
    value = int(problem.answer)
    kind = rng.randrange(4)
    if kind == 0:
        candidate = value + rng.choice([-1, 1])
    elif kind == 1:
        candidate = value + rng.choice([-10, 10])
    elif kind == 2:
        candidate = value * 10 + rng.randrange(10)  # one digit too many
    else:
        candidate = value // 10 if abs(value) >= 10 else value + rng.choice([-2, 2, 3])  # one digit too few
    return str(candidate) if candidate != value else str(value + 1)


def reward(response_text: str, finished: bool, problem: Problem) -> float:
    """1.0 when the response is exactly the answer and ended with EOS, else 0.0 (the arithmetic task's
    reward; ``tasks.registry.reward`` picks it or another task's by ``problem.task``)."""
    return 1.0 if finished and response_text.strip() == problem.answer else 0.0


def make_preferences(problems: list[Problem], seed: int) -> list[dict]:
    """Preference pairs: chosen = the correct answer, rejected = a plausible wrong one."""
    rng = random.Random(seed)
    return [
        {"prompt": p.prompt, "chosen": p.answer, "rejected": wrong_answer(p, rng), "answer": p.answer}
        for p in problems
    ]
