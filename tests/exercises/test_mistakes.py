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


def test_every_failed_case_of_a_wrong_convention_names_it_not_a_side_effect():
    """The cases that compare values name the convention too: token-mean's empty-row case says token-mean, not that the
    empty row broke it; k1's negative values are k1, not float32 rounding; its finite 100-nat value is not an overflow."""
    token_mean = {c.name: c for c in grade("s5_grpo_loss", WRONG["s5_grpo_loss"]["token mean"]["source"], sandbox_run=False).cases}
    for case in ("aggregation", "empty_rows", "values"):
        assert token_mean[case].mistake.startswith("your loss is `token-mean`"), token_mean[case]
    k1 = {c.name: c for c in grade("p9_k3", WRONG["p9_k3"]["k1"]["source"], sandbox_run=False).cases}
    for case in ("values", "nonnegative", "large_gap"):
        assert not k1[case].passed and k1[case].mistake.startswith("this is k1"), k1[case]
    no_clamp = {c.name: c for c in grade("p9_k3", WRONG["p9_k3"]["no clamp"]["source"], sandbox_run=False).cases}
    assert no_clamp["large_gap"].mistake.startswith("not finite for a large gap")
