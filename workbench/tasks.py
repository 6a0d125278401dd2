"""A synthetic task with a verifiable reward: digit arithmetic.

Prompts look like ``"47+8="`` and the correct response is the answer followed by EOS
(``"55<eos>"``). Operands have 1–2 digits and the operators are ``+``, ``-`` (results may be
negative) and ``*`` (single digits), so prompts span 4–6 characters and answers 1–3 characters:
enough spread in lengths for the length-dependent pitfalls (S3, S4, S5) to show.

The reward is verifiable: 1.0 for exactly the right answer ended by EOS, else 0.0 (a truncated
response with no EOS also scores 0 here; trainers add their own missing-EOS penalty on top).

Data files in ``data/`` are made by ``python scripts/make_data.py``: train and held-out test
prompts (disjoint), and preference pairs (chosen = correct, rejected = a plausible wrong answer).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from workbench.batching import pad_sequences
from workbench.tokenizer import DATA_DIR

TRAIN_PROMPTS = DATA_DIR / "arith_train.jsonl"
TEST_PROMPTS = DATA_DIR / "arith_test.jsonl"
TRAIN_PREFERENCES = DATA_DIR / "arith_preferences_train.jsonl"
TEST_PREFERENCES = DATA_DIR / "arith_preferences_test.jsonl"


@dataclass(frozen=True)
class Problem:
    """One arithmetic question: ``prompt`` (e.g. ``"47+8="``) and its correct ``answer`` (``"55"``)."""

    prompt: str
    answer: str


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
    """1.0 when the response is exactly the answer and ended with EOS, else 0.0."""
    return 1.0 if finished and response_text.strip() == problem.answer else 0.0


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------
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


def make_preferences(problems: list[Problem], seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"prompt": p.prompt, "chosen": p.answer, "rejected": wrong_answer(p, rng), "answer": p.answer}
        for p in problems
    ]


def write_data_files(n_preferences_train: int = 4000, n_preferences_test: int = 500) -> None:
    train, test = split_problems()
    write_jsonl(TRAIN_PROMPTS, [asdict(p) for p in train])
    write_jsonl(TEST_PROMPTS, [asdict(p) for p in test])
    write_jsonl(TRAIN_PREFERENCES, make_preferences(train[:n_preferences_train], seed=1))
    write_jsonl(TEST_PREFERENCES, make_preferences(test[:n_preferences_test], seed=2))


# --------------------------------------------------------------------------------------------
# Tokenization helpers
# --------------------------------------------------------------------------------------------
def encode_prompts(tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``(ids, mask)`` with BOS, ready for sampling."""
    rows = [tokenizer(p, add_special_tokens=True)["input_ids"] for p in prompts]
    return pad_sequences(rows, tokenizer.pad_token_id, side="left")


def encode_response(tokenizer, text: str, add_eos: bool = True) -> list[int]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids + [tokenizer.eos_token_id] if add_eos else ids


def decode_responses(tokenizer, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    """Response text without special tokens (EOS and pads dropped)."""
    return [
        tokenizer.decode(row[mask.bool()].tolist(), skip_special_tokens=True) for row, mask in zip(response_ids, response_mask, strict=False)
    ]


def score_responses(tokenizer, problems: list[Problem], response_ids, response_mask, finished) -> torch.Tensor:
    """Task rewards (B,) for a batch of responses."""
    texts = decode_responses(tokenizer, response_ids, response_mask)
    return torch.tensor([reward(t, bool(f), p) for t, f, p in zip(texts, finished, problems, strict=False)], dtype=torch.float32)


@torch.no_grad()
def greedy_accuracy(model, tokenizer, problems: list[Problem], *, max_new_tokens: int = 8, batch_size: int = 256) -> float:
    """Share of ``problems`` answered exactly (greedy decoding, stopped at EOS)."""
    from workbench.rollout import sample

    correct = 0.0
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        ids, mask = encode_prompts(tokenizer, [p.prompt for p in chunk])
        rollout = sample(
            model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, greedy=True,
        )
        correct += float(score_responses(tokenizer, chunk, rollout.response_ids, rollout.response_mask, rollout.finished).sum())
    return correct / len(problems)
