"""The third task: digit arithmetic whose responses sometimes restate the answer before EOS.

Why a third task: pitfall P11 (truncated responses scored as if finished) acts when a response has
stated its answer, goes on, and is cut by the budget before EOS. The shipped ``arith`` and ``sums``
policies stop right after their answer with probability ≈ 1 (docs/journal/2026-11-26.md, 12:14), so a truncated response
there is one the budget cut *inside* its answer, which a text-only reward rarely pays. Real policies do
go on after their answer ("The answer is 55. So the answer is 55. …"); a reward that extracts the first
answer pays such a response whether or not it ever stopped. This task gives a tiny policy that habit.

Format (character tokenizer: one character, one token)::

    prompt   "47+8="            (the arithmetic prompts and split of ``tasks.arithmetic``)
    response "55" | "55 55" | "55 55 55" | "55 55 55 55"  + <eos>

The supervised responses state the answer, then restate it 0–3 more times (``RESTATEMENTS`` with the
probabilities ``RESTATEMENT_WEIGHTS``, drawn once per problem with a fixed seed when the data files are
written), separated by single spaces; the longest is ``"-99 -99 -99 -99"`` + EOS, 16 tokens.

Reward (``reward``): 1.0 when the response ended with EOS and its *first* whitespace-separated field is
the answer as an integer, else 0.0 — the lenient extraction of RLHF answer parsers (the first match
counts; what follows it is not read). ``"55 54"`` scores 1, ``"54 55"`` 0, ``"55x"`` 0, a response cut
before EOS 0. ``Problem.answer`` holds the whole supervised response; ``target`` is its first field.
"""

from __future__ import annotations

import random

from workbench.tasks import arithmetic
from workbench.tasks.arithmetic import Problem

TASK = "restate"
RESTATEMENTS = (0, 1, 2, 3)  # how many times the supervised response repeats its answer after stating it
RESTATEMENT_WEIGHTS = (0.4, 0.3, 0.2, 0.1)  # their probabilities: most responses stop at once, a few go on
DATA_SEED = 3  # the draw of each problem's restatements (train and test files)


def response_of(answer: str, restatements: int) -> str:
    """``"55 55 55"`` for ``("55", 2)``: the answer, then ``restatements`` more copies, space-separated."""
    if restatements < 0:
        raise ValueError(f"restatements={restatements}: must be ≥ 0 (0 = the answer once)")
    return " ".join([answer] * (1 + restatements))


def make_problem(prompt: str, answer: str, restatements: int) -> Problem:
    """The restate ``Problem`` of an arithmetic prompt: its ``answer`` is the whole supervised response."""
    return Problem(prompt, response_of(answer, restatements), task=TASK)


def target(problem: Problem) -> str:
    """The checkable answer: the first field of the supervised response (``"55"`` of ``"55 55"``)."""
    return problem.answer.split()[0]


def first_answer(response_text: str) -> str | None:
    """The first whitespace-separated field when it is an integer (``"-7"``, ``"55"``), else None."""
    fields = response_text.split()
    if not fields:
        return None
    first = fields[0]
    digits = first[1:] if first.startswith("-") else first
    return first if digits.isdigit() and digits.isascii() else None


def answer_error(answer: str) -> str | None:
    """Why a data row's ``answer`` cannot be scored on this task (its first field must be an integer), or None;
    ``files.load_problems`` reports it with the file and line."""
    if first_answer(answer) is None:
        return f"the restate answer {answer!r} does not start with an integer; write the answer, restated or not, e.g. '55 55'"
    return None


def restatement_count(response_text: str) -> int:
    """How many fields follow the first one (0 for a response that stopped at its answer)."""
    return max(len(response_text.split()) - 1, 0)


def reward(response_text: str, finished: bool, problem: Problem) -> float:
    """1.0 when the response ended with EOS and its first field is the answer, else 0.0 (what follows is not read)."""
    if not finished:
        return 0.0
    answer = first_answer(response_text)
    return 1.0 if answer is not None and int(answer) == int(target(problem)) else 0.0


def response_tokens(problem: Problem) -> int:
    """Tokens of the supervised response under the character tokenizer, EOS included."""
    return len(problem.answer) + 1


def split_problems(seed: int = DATA_SEED) -> tuple[list[Problem], list[Problem]]:
    """The arithmetic task's train/test split (same prompts, same order), each problem's restatements drawn
    with ``seed``: test problems first, then train, so both files are fixed by the one seed."""
    train, test = arithmetic.split_problems()
    rng = random.Random(seed)

    def restated(problems: list[Problem]) -> list[Problem]:
        counts = rng.choices(RESTATEMENTS, weights=RESTATEMENT_WEIGHTS, k=len(problems))
        return [make_problem(p.prompt, p.answer, k) for p, k in zip(problems, counts, strict=True)]

    test_restated = restated(test)
    return restated(train), test_restated
