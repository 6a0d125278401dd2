"""The tasks' data files in ``data/``: held-out train/test prompts (every task) and preference pairs (arithmetic) as JSONL.

Made by ``python scripts/make_data.py`` (``write_data_files``, ``write_sums_files``, ``write_restate_files``).
``python -m workbench train --data`` points the same readers at user files, so every defect is an ``InputError`` of the form
``FILE:LINE: problem. fix``: a missing or empty file, bytes that are not UTF-8, a line that is not
JSON, a row that is not an object, a row without the keys its kind needs (named, with the keys
found), a value that is not a string. Line numbers are the file's own (1-based, blank lines counted).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from workbench.core.errors import InputError
from workbench.core.paths import DATA_DIR
from workbench.tasks import restate, sums
from workbench.tasks.arithmetic import Problem, make_preferences, split_problems
from workbench.tasks.registry import TASKS, task_info

TRAIN_PROMPTS = TASKS["arith"].train_prompts
TEST_PROMPTS = TASKS["arith"].test_prompts
TRAIN_PREFERENCES = DATA_DIR / "arith_preferences_train.jsonl"
TEST_PREFERENCES = DATA_DIR / "arith_preferences_test.jsonl"


@dataclass(frozen=True)
class RowKind:
    """What one line of a kind of data file must hold: string values under ``keys``."""

    name: str
    keys: tuple[str, ...]
    example: str

    def fix(self) -> str:
        return f"Each {self.name} row needs the string keys {', '.join(self.keys)}, e.g. {self.example}"


PROMPT_ROW = RowKind("prompt", ("prompt", "answer"), '{"prompt": "12+7=", "answer": "19"}')
PREFERENCE_ROW = RowKind("preference-pair", ("prompt", "chosen", "rejected"),
                         '{"prompt": "12+7=", "chosen": "19", "rejected": "18"}')


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def _text(path: Path) -> str:
    if not path.exists():
        raise InputError(f"{path}: the data file is missing. Pass an existing JSONL file (one JSON object per line), "
                         "or run `python scripts/make_data.py` to create the shipped ones.")
    if not path.is_file():
        raise InputError(f"{path}: is a folder, not a data file. Pass the path of a JSONL file.")
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{path}:{line}: byte 0x{data[exc.start]:02x} at offset {exc.start} is not UTF-8 text. "
                         "Save the file as UTF-8 (JSON Lines files are UTF-8).") from None


def numbered_rows(path: str | Path, kind: RowKind | None = None) -> list[tuple[int, dict]]:
    """``(line number, row)`` for every non-blank line of a JSONL file, each checked to be a JSON object
    (and, with ``kind``, to hold that kind's keys as strings); ``InputError`` naming file and line otherwise."""
    path = Path(path)
    fix = kind.fix() if kind else "Each line must be one JSON object"
    rows = []
    for number, line in enumerate(_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{number}: not valid JSON ({exc.msg} at column {exc.colno}). Write one JSON object "
                             f"per line. {fix}.") from None
        if not isinstance(row, dict):
            raise InputError(f"{path}:{number}: a JSON {type(row).__name__}, not an object. Write one JSON object per line. {fix}.")
        if kind is not None:
            _check_row(path, number, row, kind)
        rows.append((number, row))
    if not rows:
        raise InputError(f"{path}: the data file is empty (no rows). A dataset needs at least one row. {fix}.")
    return rows


def _check_row(path: Path, number: int, row: dict, kind: RowKind) -> None:
    missing = [k for k in kind.keys if k not in row]
    if missing:
        found = ", ".join(map(repr, row)) or "none"
        raise InputError(f"{path}:{number}: the row lacks {', '.join(map(repr, missing))} (keys found: {found}). {kind.fix()}.")
    for key in kind.keys:
        if not isinstance(row[key], str):
            raise InputError(f"{path}:{number}: {key!r} must be a string, not the {type(row[key]).__name__} {row[key]!r}. "
                             f"Write it in quotes, e.g. {json.dumps(str(row[key]))}. {kind.fix()}.")


def read_jsonl(path: str | Path) -> list[dict]:
    """The rows of a JSONL file (blank lines skipped), each a JSON object."""
    return [row for _, row in numbered_rows(path)]


def load_problems(path: str | Path = TRAIN_PROMPTS) -> list[Problem]:
    """Problems from a JSONL file with string ``prompt`` and ``answer`` fields (RL prompts and SFT data)
    and an optional ``task`` (a name of ``tasks.registry.TASKS``; absent: ``"arith"``)."""
    problems = []
    for number, row in numbered_rows(path, PROMPT_ROW):
        task = row.get("task", "arith")
        if task not in TASKS:
            raise InputError(f"{path}:{number}: task {task!r} is not a task of the workbench. Write one of "
                             f"{', '.join(map(repr, TASKS))}, or leave 'task' out for arithmetic.")
        why = TASKS[task].answer_error(row["answer"])
        if why is not None:
            raise InputError(f"{path}:{number}: {why} (the task's reward reads it; task {task!r}).")
        problems.append(Problem(row["prompt"], row["answer"], task))
    return problems


def rl_problems(n: int = 256, task: str = "arith") -> list[Problem]:
    """The first ``n`` training problems of ``task``: a prompt set small enough that a short RL run
    revisits each prompt and the reward visibly rises within tens of steps on a CPU."""
    return load_problems(task_info(task).train_prompts)[:n]


def problem_row(problem: Problem) -> dict:
    """A problem as a data-file row: ``prompt`` and ``answer``, and ``task`` unless it is arithmetic (so the
    arithmetic files keep their two keys)."""
    row = {"prompt": problem.prompt, "answer": problem.answer}
    return row if problem.task == "arith" else {**row, "task": problem.task}


def load_preferences(path: str | Path = TRAIN_PREFERENCES) -> list[dict]:
    """Preference pairs ``{"prompt", "chosen", "rejected"}`` (and optionally ``"answer"``) from JSONL."""
    return [row for _, row in numbered_rows(path, PREFERENCE_ROW)]


def write_prompt_files(task: str, train: list[Problem], test: list[Problem]) -> None:
    """A task's train/test prompt files (``tasks.registry``: ``data/<task>_{train,test}.jsonl``), one row per problem."""
    info = task_info(task)
    write_jsonl(info.train_prompts, [problem_row(p) for p in train])
    write_jsonl(info.test_prompts, [problem_row(p) for p in test])


def write_data_files(n_preferences_train: int = 4000, n_preferences_test: int = 500) -> None:
    """The arithmetic task's files: train/test prompts and preference pairs."""
    train, test = split_problems()
    write_prompt_files("arith", train, test)
    write_jsonl(TRAIN_PREFERENCES, make_preferences(train[:n_preferences_train], seed=1))
    write_jsonl(TEST_PREFERENCES, make_preferences(test[:n_preferences_test], seed=2))


def write_sums_files() -> None:
    """The sums task's files: train/test prompts (``tasks.sums.split_problems``, seed 0, disjoint)."""
    write_prompt_files("sums", *sums.split_problems())


def write_restate_files() -> None:
    """The restate task's files: the arithmetic split, each response restated by ``tasks.restate.split_problems``."""
    write_prompt_files("restate", *restate.split_problems())
