"""The exercise notebooks are the generator's output, and its nbgrader source notebooks become them under nbgrader.

``scripts/make_exercise_notebooks.py`` writes the notebooks handed out; ``--nbgrader-source DIR`` writes the teacher's
nbgrader source notebooks, whose stub cell holds the solution between nbgrader's delimiters. nbgrader's
``generate_assignment`` replaces that region by its stub (``ClearSolutions``, simulated here: nbgrader is no dependency of
the workbench), which must give the stub handed out, ``def`` and docstring kept; the solution inside must score 1.
"""

import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

from workbench.exercises import EXERCISES, grade
from workbench.exercises.submissions import code_of

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("make_exercise_notebooks", ROOT / "scripts" / "make_exercise_notebooks.py")
make = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make)


def clear_solutions(source: str) -> str:
    """nbgrader's ClearSolutions on a code cell: each BEGIN/END SOLUTION region becomes its indented code stub."""
    pattern = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION\n.*?^[ \t]*### END SOLUTION$", re.MULTILINE | re.DOTALL)
    return pattern.sub(lambda m: f"{m['indent']}# YOUR CODE HERE\n{m['indent']}raise NotImplementedError()", source)


@pytest.mark.parametrize("name", list(EXERCISES))
def test_committed_notebook_is_the_generators_output(name, tmp_path):
    """Edit the texts in the script, then run it: a notebook edited by hand (or a script run forgotten) fails here."""
    path = make.path_of(name, tmp_path)
    make.write(make.notebook(name), name, path)
    assert make.path_of(name).read_text() == path.read_text(), f"run: python scripts/make_exercise_notebooks.py ({name})"


@pytest.mark.parametrize("name", list(EXERCISES))
def test_nbgrader_source_releases_as_the_stub_and_its_solution_scores_one(name):
    source = make.nbgrader_source(name)
    handed_out = nbformat.read(make.path_of(name), as_version=4)
    cell = source.cells[make.STUB_CELL].source
    assert cell.count("### BEGIN SOLUTION") == 1 and cell.count("### END SOLUTION") == 1
    released = clear_solutions(cell)
    assert released == handed_out.cells[make.STUB_CELL].source + "()"  # nbgrader's stub raises NotImplementedError()
    assert f"def {EXERCISES[name].function}(" in released
    for i, (a, b) in enumerate(zip(source.cells, handed_out.cells, strict=True)):
        assert i == make.STUB_CELL or (a.source, a.metadata) == (b.source, b.metadata)  # only the stub cell differs
    result = grade(name, code_of(source), sandbox_run=False)
    assert result.passed and result.score == 1.0, result.feedback


def test_the_folder_handed_out_holds_no_solution():
    for path in sorted((ROOT / "notebooks" / "exercises").glob("*.ipynb")):
        assert "BEGIN SOLUTION" not in path.read_text(), path


def test_nbgrader_source_refuses_the_folder_handed_out(capsys):
    with pytest.raises(SystemExit) as exit_:
        make.main(["--nbgrader-source", str(make.OUT)])
    assert exit_.value.code == 2 and "the folder handed out" in capsys.readouterr().err
