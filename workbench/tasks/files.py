"""The task's data files in ``data/``: held-out train/test prompts and preference pairs as JSONL.

Made by ``python scripts/make_data.py`` (``write_data_files``); read with clear errors for a missing
or empty file, since ``python -m workbench train --data`` points here at user files too.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from workbench.core.paths import DATA_DIR
from workbench.tasks.arithmetic import Problem, make_preferences, split_problems

TRAIN_PROMPTS = DATA_DIR / "arith_train.jsonl"
TEST_PROMPTS = DATA_DIR / "arith_test.jsonl"
TRAIN_PREFERENCES = DATA_DIR / "arith_preferences_train.jsonl"
TEST_PREFERENCES = DATA_DIR / "arith_preferences_test.jsonl"


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def read_jsonl(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Data file {str(path)!r} is missing; run `python scripts/make_data.py` to create it.")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"Data file {str(path)!r} is empty; a dataset needs at least one row.")
    return rows


def load_problems(path: str | Path = TRAIN_PROMPTS) -> list[Problem]:
    """Problems from a JSONL file with ``prompt`` and ``answer`` fields."""
    return [Problem(row["prompt"], row["answer"]) for row in read_jsonl(path)]


def rl_problems(n: int = 256) -> list[Problem]:
    """The first ``n`` training problems: a prompt set small enough that a short RL run revisits
    each prompt and the reward visibly rises within tens of steps on a CPU."""
    return load_problems(TRAIN_PROMPTS)[:n]


def load_preferences(path: str | Path = TRAIN_PREFERENCES) -> list[dict]:
    """Preference pairs ``{"prompt", "chosen", "rejected", "answer"}`` from JSONL."""
    rows = read_jsonl(path)
    for i, row in enumerate(rows):
        missing = {"prompt", "chosen", "rejected"} - set(row)
        if missing:
            raise ValueError(f"{path}: row {i} lacks {sorted(missing)}; each pair needs prompt, chosen and rejected")
    return rows


def write_data_files(n_preferences_train: int = 4000, n_preferences_test: int = 500) -> None:
    train, test = split_problems()
    write_jsonl(TRAIN_PROMPTS, [asdict(p) for p in train])
    write_jsonl(TEST_PROMPTS, [asdict(p) for p in test])
    write_jsonl(TRAIN_PREFERENCES, make_preferences(train[:n_preferences_train], seed=1))
    write_jsonl(TEST_PREFERENCES, make_preferences(test[:n_preferences_test], seed=2))
