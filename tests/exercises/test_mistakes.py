"""Every plausible wrong solution scores below 1 and its feedback names the mistake (graded in this process: trusted code).

The wrong solutions are data (wrong_solutions.toml): each one's source text, readable as code, and the fragment its
feedback must contain."""

import tomllib
from pathlib import Path

import pytest

from workbench.exercises import EXERCISES, grade

WRONG = tomllib.loads(Path(__file__).with_name("wrong_solutions.toml").read_text(encoding="utf-8"))
CASES = [(name, label) for name, wrongs in WRONG.items() for label in wrongs]


def test_at_least_three_wrong_solutions_per_exercise():
    assert set(WRONG) == set(EXERCISES)
    assert all(len(w) >= 3 for w in WRONG.values())


@pytest.mark.parametrize(("name", "label"), CASES, ids=[f"{n}-{lab}" for n, lab in CASES])
def test_wrong_solution_feedback_names_the_mistake(name, label):
    wrong = WRONG[name][label]
    result = grade(name, wrong["source"], sandbox_run=False)
    assert not result.passed and result.score < 1
    assert any(wrong["feedback_contains"] in m for m in result.mistakes), result.feedback
    assert wrong["feedback_contains"] in result.feedback
