"""The sandbox: the learner's code in a child interpreter; a hang, an exception, a wrong type or a print is one case's 0;
a notebook's cells load one by one; a function travels with what it uses."""

import importlib
import time

import pytest
import torch

from workbench.exercises import grade, solution_source
from workbench.exercises.grading import source_of
from workbench.exercises.sandbox import cell_mark, load_function

NASTY = '''
def grpo_loss(per_token_loss, mask):
    print("debugging output on stdout must not break the grader")
    if mask.shape[0] == 3:        # the empty-rows case: an infinite loop
        while True:
            pass
    if mask.shape[0] == 5:        # the values case: an exception
        raise ValueError("boom")
    if mask.shape[0] == 2:        # the gradient case: a wrong return type
        return [1.0]
    lengths = mask.sum(-1)
    return ((per_token_loss * mask).sum(-1) / lengths.clamp_min(1)).mean()
'''


def test_hang_exception_and_wrong_type_are_each_a_zero_with_a_message():
    start = time.perf_counter()
    result = grade("s5_grpo_loss", NASTY, time_limit_s=3)
    cases = {c.name: c for c in result.cases}
    assert cases["aggregation"].passed  # the cases before and after the hang still run
    assert "time limit" in cases["empty_rows"].got
    assert "raised ValueError: boom (your line 8" in cases["values"].got
    assert "returned list" in cases["gradient"].got
    assert result.score == 0.25
    assert time.perf_counter() - start < 120


def test_solution_scores_one_through_the_sandbox():
    result = grade("p9_k3", solution_source("p9_k3"))
    assert result.passed and result.score == 1.0, result.feedback


def test_a_notebook_cell_that_raises_does_not_stop_the_others():
    """Cells load one by one, as nbgrader runs a notebook (errors allowed): a failing scratch cell costs nothing."""
    text = "\n\n".join([cell_mark(2), "x = 1", cell_mark(3), solution_source("p9_k3"), cell_mark(4), "k3(logp, ref)  # scratch",
                        cell_mark(6), "def broken(:", cell_mark(7), "y = x + 1"])
    result = grade("p9_k3", text, sandbox_run=False)
    assert result.passed and result.score == 1.0, result.feedback
    assert result.notes == ["cell 4 raised NameError: name 'logp' is not defined (line 22)",
                            "cell 6: SyntaxError on line 26: invalid syntax"]
    assert "note: cell 4 raised NameError" in result.feedback


def test_without_the_function_the_failed_cells_say_why():
    text = "\n".join([cell_mark(3), "import missing_module_xyz", "def k3(logp, ref_logp):", "    return logp", cell_mark(4), "z = 1"])
    result = grade("p9_k3", text, sandbox_run=False)
    assert result.score == 0 and "no function named `k3`" in result.error
    assert "cell 3 raised ModuleNotFoundError: No module named 'missing_module_xyz' (line 2)" in result.error
    single = grade("p9_k3", "import missing_module_xyz\n", sandbox_run=False)  # plain text: one chunk, a message naming no cell
    assert single.error == "running your code raised ModuleNotFoundError: No module named 'missing_module_xyz' (line 1)"


HELPERS = '''
import math as m
import torch
from torch import expm1 as em1

CLAMP = 20.0
WEIGHTS = torch.ones(3)  # a tensor: cannot travel as code


def _ratio(logp, ref_logp):
    return (ref_logp - logp).clamp(-CLAMP, CLAMP)


def k3(logp, ref_logp):
    r = _ratio(logp, ref_logp)
    assert m.isfinite(CLAMP)
    return (em1(r) - r).clamp_min(0)


def k3_weighted(logp, ref_logp):
    return k3(logp, ref_logp) * WEIGHTS
'''


def test_the_function_travels_with_its_helpers_imports_and_constants(tmp_path, monkeypatch):
    """grade(name, fn) from a notebook: what fn uses from its globals goes into the sandbox with it."""
    (tmp_path / "learner_k3.py").write_text(HELPERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    learner = importlib.import_module("learner_k3")
    text = source_of(learner.k3)
    for line in ("import math as m", "from torch import expm1 as em1", "CLAMP = 20.0", "def _ratio(logp, ref_logp):"):
        assert line in text, text
    assert "WEIGHTS" not in text and "k3_weighted" not in text  # only what k3 uses
    result = grade("p9_k3", learner.k3)  # through the sandbox
    assert result.passed and result.score == 1.0, result.feedback
    weighted, error, _ = load_function(source_of(learner.k3_weighted), "k3_weighted")  # a tensor global: left out, named
    assert error == "" and "WEIGHTS =" not in source_of(learner.k3_weighted)
    with pytest.raises(NameError, match="name 'WEIGHTS' is not defined"):
        weighted(torch.zeros(3), torch.zeros(3))
