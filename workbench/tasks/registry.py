"""The tasks by name: what a trainer, an evaluation or a script needs to know about each one.

``TASKS["arith"]`` is the digit arithmetic of ``tasks.arithmetic`` (answers of 1–3 characters);
``TASKS["sums"]`` the running sums of ``tasks.sums`` (scratchpad responses of 8–37 tokens);
``TASKS["restate"]`` the arithmetic of ``tasks.restate``, whose responses restate the answer 0–3 times. A
``TaskInfo`` names the task's prompt files in ``data/``, the ``max_new_tokens`` its held-out evaluation
decodes (room for its longest correct response), its default shipped checkpoint (a built-in name of
``workbench.experiments.checkpoints.load``) and its reward. ``reward`` scores a response by ``problem.task``,
so a batch of problems from either task is scored by the right rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workbench.core.errors import ParameterError
from workbench.core.paths import DATA_DIR
from workbench.tasks import arithmetic, restate, sums
from workbench.tasks.arithmetic import Problem


def any_text_scores(answer: str) -> str | None:
    """``answer_error`` of a task whose reward compares any text exactly (arith): nothing to refuse."""
    return None


@dataclass(frozen=True)
class TaskInfo:
    """One task: its name, a one-line description, train/test prompt files (JSONL), the greedy
    evaluation's ``max_new_tokens``, the default checkpoint's built-in name and the reward function
    ``reward(response_text, finished, problem) -> float``; ``answer_error(answer) -> str | None`` says why a data
    row's answer cannot be scored on the task (None: it can), checked when a data file is read."""

    name: str
    description: str
    train_prompts: Path
    test_prompts: Path
    max_new_tokens: int
    checkpoint: str
    reward: Callable[[str, bool, Problem], float]
    answer_error: Callable[[str], str | None] = any_text_scores

    @classmethod
    def shipped(cls, name: str, description: str, *, max_new_tokens: int, reward: Callable[[str, bool, Problem], float],
                answer_error: Callable[[str], str | None] = any_text_scores) -> TaskInfo:
        """A task shipped with the workbench, by its naming convention: prompts in ``data/<name>_{train,test}.jsonl``
        (``scripts/make_data.py``), checkpoint ``tiny-<name>-qwen2`` (``scripts/train_tiny_checkpoint.py``)."""
        return cls(name=name, description=description, train_prompts=DATA_DIR / f"{name}_train.jsonl",
                   test_prompts=DATA_DIR / f"{name}_test.jsonl", max_new_tokens=max_new_tokens,
                   checkpoint=f"tiny-{name}-qwen2", reward=reward, answer_error=answer_error)

    @property
    def checkpoint_folder(self) -> Path:
        """Where the default checkpoint lives (``data/checkpoints/<checkpoint>``)."""
        return DATA_DIR / "checkpoints" / self.checkpoint


TASKS = {
    "arith": TaskInfo.shipped(
        "arith", 'digit arithmetic: "47+8=" -> "55" (answers of 1-3 characters)',
        max_new_tokens=8,  # the longest answer (3) + EOS, with room to spare
        reward=arithmetic.reward,
    ),
    "sums": TaskInfo.shipped(
        "sums", 'running sums of 2-8 numbers as a scratchpad: "sum 3 5 9 =" -> "3 8 17 ; 17" (8-37 tokens)',
        max_new_tokens=48,  # the longest correct response is 37 tokens: room for a policy that rambles a little
        reward=sums.reward, answer_error=sums.answer_error,
    ),
    "restate": TaskInfo.shipped(
        "restate", 'digit arithmetic, the answer restated 0-3 times: "47+8=" -> "55 55" (the reward reads the first answer)',
        max_new_tokens=16,  # the longest supervised response: "-99 -99 -99 -99" + EOS
        reward=restate.reward, answer_error=restate.answer_error,
    ),
}


def task_info(name: str) -> TaskInfo:
    """The ``TaskInfo`` of ``name``; ParameterError naming the valid tasks otherwise."""
    if name not in TASKS:
        raise ParameterError(f"task={name!r} is not a task of the workbench. Use one of {', '.join(map(repr, TASKS))} "
                             "(workbench/tasks/registry.py: TASKS).")
    return TASKS[name]


def reward(response_text: str, finished: bool, problem: Problem) -> float:
    """The task reward of one response, by ``problem.task`` (arith: exact answer + EOS; sums: final answer
    after the marker + EOS)."""
    return task_info(problem.task).reward(response_text, finished, problem)


def max_new_tokens_for(problems: list[Problem]) -> int:
    """The largest ``max_new_tokens`` among the tasks of ``problems`` (8 for arithmetic alone)."""
    return max((task_info(t).max_new_tokens for t in {p.task for p in problems}), default=TASKS["arith"].max_new_tokens)
