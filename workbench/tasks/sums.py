"""The second task: running sums of a short list, written as a scratchpad (responses of 8–37 tokens).

Why a second task: the arithmetic task's answers are 1–3 characters, so a pitfall that acts through
response *length* (per-sequence vs per-token loss weights, truncation, padded shares, decoding past EOS)
has no room to act. Here the correct response's length depends on the problem, and a wrong one can be
short (stop early) or long (repeat or add steps).

Format (character tokenizer: one character, one token)::

    prompt   "sum 3 5 9 ="
    response "3 8 17 ; 17" + <eos>

The response lists the running (partial) sums separated by single spaces, then the marker ``" ; "``
and the final sum, then EOS. A problem has 2–8 numbers, all 0–9 or all 0–99 (drawn per problem), so
a correct response spans 8 tokens (``"0 0 ; 0"`` + EOS) to 37 tokens (eight numbers near 99);
``response_tokens`` counts them.

Reward (``reward``): 1.0 when the response ended with EOS and the text after the first marker ``;``
is exactly the target integer (surrounding spaces ignored), else 0.0. The partial sums are not checked:
a response that jumps to ``"; 17"`` scores 1, as the final-answer rewards of RLHF tasks do. A missing
marker, trailing text after the answer (``"; 17 5"``), or a response cut off before EOS score 0.
``format_weight`` (off by default: 0.0, and the trainers never pass it) adds that much when the whole
response has the scratchpad's shape (integers, one marker, one integer after it), right or wrong.
"""

from __future__ import annotations

import random
import re

from workbench.tasks.arithmetic import Problem

TASK = "sums"
PREFIX = "sum "
MARKER = ";"
LIST_LENGTHS = (2, 8)  # fewest and most numbers in a problem (inclusive)
NUMBER_MAXIMA = (9, 99)  # each problem draws all its numbers from 0..m for one m of these
_INTEGER = re.compile(r"-?\d+")
_SHAPE = re.compile(r"\s*-?\d+(?: -?\d+)*\s*;\s*-?\d+\s*")


def prompt_of(numbers: list[int]) -> str:
    """``"sum 3 5 9 ="`` for ``[3, 5, 9]``."""
    return PREFIX + " ".join(map(str, numbers)) + " ="


def numbers_of(prompt: str) -> list[int]:
    """The list of a sums prompt (the inverse of ``prompt_of``); ValueError for another prompt."""
    if not (prompt.startswith(PREFIX) and prompt.endswith("=")):
        raise ValueError(f"{prompt!r} is not a sums prompt; expected e.g. {prompt_of([3, 5, 9])!r}")
    return [int(x) for x in prompt[len(PREFIX):-1].split()]


def response_of(numbers: list[int]) -> str:
    """The correct response (without EOS): running sums, the marker, the total: ``"3 8 17 ; 17"``."""
    partial, total = [], 0
    for number in numbers:
        total += number
        partial.append(str(total))
    return " ".join(partial) + f" {MARKER} {total}"


def make_problem(numbers: list[int]) -> Problem:
    """The sums ``Problem``: its ``answer`` is the whole correct response (what SFT trains on)."""
    return Problem(prompt_of(numbers), response_of(numbers), task=TASK)


def target(problem: Problem) -> str:
    """The checkable final answer: the total, i.e. the text after the marker of the correct response."""
    return problem.answer.split(MARKER, 1)[1].strip()


def answer_error(answer: str) -> str | None:
    """Why a data row's ``answer`` cannot be scored on this task (its total must be an integer after the marker), or
    None; ``files.load_problems`` reports it with the file and line."""
    if final_answer(answer) is None:
        return (f"the sums answer {answer!r} has no integer after the marker {MARKER!r}; write the scratchpad and its total, "
                f"e.g. {response_of([3, 5, 9])!r}")
    return None


def final_answer(response_text: str) -> str | None:
    """The integer written after the first marker, or None (no marker, nothing or not one integer after it)."""
    if MARKER not in response_text:
        return None
    after = response_text.split(MARKER, 1)[1].strip()
    return after if _INTEGER.fullmatch(after) else None


def well_formed(response_text: str) -> bool:
    """The scratchpad's shape: integers separated by spaces, one marker, one integer after it."""
    return _SHAPE.fullmatch(response_text) is not None


def reward(response_text: str, finished: bool, problem: Problem, format_weight: float = 0.0) -> float:
    """1.0 when the response ended with EOS and its final answer (after the marker) is the total, else
    0.0; plus ``format_weight`` for a finished, well-formed response (off by default)."""
    if not finished:
        return 0.0
    answer = final_answer(response_text)
    correct = 1.0 if answer is not None and int(answer) == int(target(problem)) else 0.0
    return correct + (format_weight if format_weight and well_formed(response_text) else 0.0)


def response_tokens(problem: Problem) -> int:
    """Tokens of the correct response under the character tokenizer, EOS included."""
    return len(problem.answer) + 1


def random_numbers(rng: random.Random) -> list[int]:
    """One list: a length in ``LIST_LENGTHS``, a maximum from ``NUMBER_MAXIMA``, numbers uniform in 0..maximum."""
    length = rng.randint(*LIST_LENGTHS)
    maximum = rng.choice(NUMBER_MAXIMA)
    return [rng.randint(0, maximum) for _ in range(length)]


def split_problems(n_train: int = 20000, n_test: int = 1000, seed: int = 0) -> tuple[list[Problem], list[Problem]]:
    """A fixed train/test split of distinct random problems (no prompt in both): the first ``n_test``
    distinct lists drawn with ``seed`` are the test set, the next ``n_train`` distinct ones the train set."""
    rng = random.Random(seed)
    seen: set[str] = set()
    problems: list[Problem] = []
    while len(problems) < n_train + n_test:
        problem = make_problem(random_numbers(rng))
        if problem.prompt not in seen:
            seen.add(problem.prompt)
            problems.append(problem)
    return problems[n_test:], problems[:n_test]
