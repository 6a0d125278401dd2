"""Every plausible wrong solution scores below 1 and its feedback names the mistake (graded in this process: trusted code)."""

import pytest

from tests.exercises.wrong_solutions import WRONG
from workbench.exercises import EXERCISES, grade

CASES = [(name, label) for name, wrongs in WRONG.items() for label in wrongs]


def test_at_least_three_wrong_solutions_per_exercise():
    assert set(WRONG) == set(EXERCISES)
    assert all(len(w) >= 3 for w in WRONG.values())


@pytest.mark.parametrize(("name", "label"), CASES, ids=[f"{n}-{lab}" for n, lab in CASES])
def test_wrong_solution_feedback_names_the_mistake(name, label):
    source, fragment = WRONG[name][label]
    result = grade(name, source, sandbox_run=False)
    assert not result.passed and result.score < 1
    assert any(fragment in m for m in result.mistakes), result.feedback
    assert fragment in result.feedback
