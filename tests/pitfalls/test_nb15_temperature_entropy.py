"""Notebook 15's pitfall module: the figure, the explorer and the metrics the notebook writes."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.experiments.checkpoints import load  # noqa: E402
from workbench.pitfalls import nb15_temperature_entropy as te  # noqa: E402
from workbench.tasks import rl_problems  # noqa: E402

PROMPTS = [p.prompt for p in rl_problems(8)]


@pytest.fixture(scope="module")
def qwen():
    return load("tiny-arith-qwen2")


def test_entropy_temperature_explorer_redraws_on_a_control_change(qwen):
    explorer = te.entropy_temperature_explorer(te.last_position_logits(*qwen, PROMPTS[0]))
    assert abs(explorer.last["entropy_gap"]) > 1e-4  # τ = 0.7 at start
    explorer.controls["temperature"].value = 1.0
    assert explorer.renders == 2 and explorer.last["entropy_gap"] == pytest.approx(0.0, abs=1e-6)


def test_figure_and_metrics(qwen, tmp_path):
    rows = te.sweep(*qwen, PROMPTS, [0.5, 1.0])
    fig = te.figure_entropy_vs_temperature(rows)
    assert len(fig.axes) == 2 and all(len(ax.lines) >= 2 for ax in fig.axes)
    plt.close(fig)
    written = written_metrics(te.metrics(rows, headline_temperature=0.6), tmp_path)
    assert (written["reproduced"], written["fixed"]) == te.verdict(rows)
    assert set(written["metrics"]["entropy_raw"]) == {"0.5", "1.0"}
    assert written["metrics"]["entropy_gap_at_headline_temperature"] == pytest.approx(rows[0]["entropy_gap"])  # 0.5 is nearest 0.6
    assert written["headline"]["what"].endswith("(τ = 0.5)")
    assert te.headline_sentence(rows, 0.6).startswith("At τ = 0.5:")
