"""Notebook 14's pitfall module: the figure, the explorer and the metrics the notebook writes."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.experiments.checkpoints import load  # noqa: E402
from workbench.pitfalls import nb14_truncated_sampling as ts  # noqa: E402
from workbench.tasks import rl_problems  # noqa: E402

PROMPTS = [p.prompt for p in rl_problems(8)]


@pytest.fixture(scope="module")
def rows_and_model():
    model, tokenizer = load("tiny-arith-qwen2")
    return ts.sweep(model, tokenizer, PROMPTS, ts.settings_for([0.8], [2])), model, tokenizer


def test_settings_cover_no_filter_then_each_filter_alone():
    assert ts.settings_for([0.5, 0.8], [4]) == [(0, 1.0), (0, 0.5), (0, 0.8), (4, 1.0)]


def test_filter_ratio_explorer_redraws_on_a_control_change(rows_and_model):
    _, model, tokenizer = rows_and_model
    explorer = ts.filter_ratio_explorer(model, tokenizer, PROMPTS)
    explorer.controls["top_p"].value = 0.5
    assert explorer.renders == 2 and explorer.last["kept_mass"] < 1.0


def test_figure_and_metrics(rows_and_model, tmp_path):
    rows = rows_and_model[0]
    fig = ts.figure_ratio_vs_kept_mass(rows)
    assert len(fig.axes) == 2 and len(fig.axes[1].patches) == 2 * len(rows)  # bug and fix bars per setting
    plt.close(fig)
    head = ts.headline_row(rows)
    assert (head["top_k"], head["top_p"]) == (0, 0.8)
    written = written_metrics(ts.metrics(rows), tmp_path)
    assert written["reproduced"] == ts.verdict(head)[0]
    assert written["fixed"] == all(ts.verdict(r)[1] for r in rows)
    assert [(s["top_k"], s["top_p"]) for s in written["metrics"]["settings"]] == [(r["top_k"], r["top_p"]) for r in rows]
    assert written["headline"]["bug"] == pytest.approx(head["bug"]["mean_ratio"])
    assert ts.headline_sentence(rows).startswith("Headline (top_k=0, top_p=0.8)")
    assert len(ts.sweep_lines(rows).splitlines()) == len(rows)
