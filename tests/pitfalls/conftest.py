"""Fixtures the pitfall test files share: the tiny trained checkpoint their catalogue checks run on, and a check of
every figure a test leaves open (a module's figures and its explorers' redraws) at notebook width."""

import sys

import pytest

from workbench.experiments.checkpoints import load


@pytest.fixture(scope="module")
def qwen():
    """tiny-arith-qwen2 (model, tokenizer), loaded once per test module."""
    return load("tiny-arith-qwen2")


@pytest.fixture(autouse=True)
def _figures_readable_at_notebook_width():
    """After each test, every pyplot figure still open (closed afterwards by the root conftest) is measured by
    ``viz.legibility.check_figure``: the explorers' figures are drawn only here, never in a batch run."""
    yield
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    from workbench.viz import legibility

    problems = {}
    from tests.pitfalls.pitfall_fakes import TEST_LAYOUT

    for number in pyplot.get_fignums():
        figure = pyplot.figure(number)
        if figure.get_label() == TEST_LAYOUT:
            continue
        found = legibility.check_figure(figure).problems()
        if found:
            problems[f"figure {number} ({figure.get_size_inches()[0]:.1f} × {figure.get_size_inches()[1]:.1f} in)"] = found
    assert not problems, "figures not readable at notebook width: " + repr(problems)
