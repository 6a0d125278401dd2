"""grade(): the solutions score 1, the stubs as handed out score 0 without crashing, Grade round-trips and plots."""

import json
from pathlib import Path

import nbformat
import pytest

from workbench.core.errors import InputError
from workbench.exercises import EXERCISES, Grade, grade, grade_solutions, solution_source
from workbench.exercises.submissions import code_of, exercise_of

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks" / "exercises"


def exercise_notebooks():
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def test_every_exercise_has_one_notebook_and_one_solution():
    names = [exercise_of(json.loads(p.read_text()), p) for p in exercise_notebooks()]
    assert sorted(names) == sorted(EXERCISES)
    for name in EXERCISES:
        assert f"def {EXERCISES[name].function}(" in solution_source(name)
    assert not list(NOTEBOOKS.rglob("*solution*")), "the folder handed out must not hold the solutions"


def test_solutions_score_one():
    grades = grade_solutions()
    assert [g.exercise for g in grades] == list(EXERCISES)
    for g in grades:
        assert g.passed and g.score == 1.0, g.feedback


@pytest.mark.parametrize("path", exercise_notebooks(), ids=lambda p: p.stem)
def test_stub_as_handed_out_scores_zero(path):
    nb = json.loads(path.read_text())
    result = grade(exercise_of(nb, path), code_of(nb), sandbox_run=False)
    assert result.score == 0.0 and not result.passed
    assert all("NotImplementedError" in c.got for c in result.cases), result.feedback


def test_notebook_layout_and_nbgrader_metadata():
    for path in exercise_notebooks():
        nb = nbformat.read(path, as_version=4)
        name = nb.metadata["workbench"]["exercise"]
        assert nb.cells[0].cell_type == "markdown" and f"../{EXERCISES[name].lesson}.ipynb" in nb.cells[0].source
        assert nb.cells[1].metadata.get("tags") == ["parameters"]
        stub = nb.cells[2]
        assert stub.metadata["nbgrader"]["solution"] and f"def {EXERCISES[name].function}(" in stub.source
        assert "raise NotImplementedError" in stub.source
        graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
        assert len(graded) == 1 and graded[0].metadata["nbgrader"]["points"] > 0
        assert "Going further" in nb.cells[-1].source
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")


def test_grade_round_trips_through_json_and_names_the_lesson():
    result = grade("s5_grpo_loss", "def grpo_loss(per_token_loss, mask):\n    return (per_token_loss * mask).sum() / mask.sum()\n",
                   sandbox_run=False)
    back = Grade.from_dict(json.loads(json.dumps(result.to_dict())))
    assert back.feedback == result.feedback and back.score == result.score
    assert "05_grpo_loss_normalization" in result.feedback


def test_plot_draws_the_learner_weights_against_the_expected_ones():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    result = grade("s5_grpo_loss", "def grpo_loss(per_token_loss, mask):\n    return (per_token_loss * mask).sum() / mask.sum()\n",
                   sandbox_run=False)
    ax = result.plot()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "measured" in labels and "seq-mean-token-mean" in labels
    matplotlib.pyplot.close("all")


def test_load_errors_are_zero_with_the_reason():
    broken = grade("p9_k3", "def k3(logp, ref_logp)\n    return logp\n", sandbox_run=False)
    assert broken.score == 0 and "SyntaxError on line 1" in broken.feedback
    missing = grade("p9_k3", "def kl(logp, ref_logp):\n    return logp\n", sandbox_run=False)
    assert missing.score == 0 and "no function named `k3`" in missing.feedback


def test_unknown_exercise_names_the_valid_ones():
    with pytest.raises(InputError, match="s5_grpo_loss"):
        grade("s5_grpo", "def f(): pass")
