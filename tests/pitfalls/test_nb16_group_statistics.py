"""Notebook 16's pitfall module: the figures, the explorer and the metrics the notebook writes."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.pitfalls import nb16_group_statistics as gs  # noqa: E402


@pytest.fixture(scope="module")
def measured():
    singleton = gs.singleton_sweep([0.5, 0.95], 8)
    spreads = [1e-3, 1.0]
    errors = gs.precision_sweep(spreads)
    rewards = torch.tensor([float(i % 3 == 0) for i in range(64)]).reshape(8, 8)
    partial = gs.partial_group_sweep(rewards, [0.1, 0.25], 8)
    return singleton, spreads, errors, partial


def test_singleton_advantage_explorer_redraws_on_a_control_change():
    explorer = gs.singleton_advantage_explorer(8)
    assert explorer.renders == 1 and abs(explorer.last["one-pass"]) > 10 * 0.95  # the fp32 one-pass residue at v = 0.95
    explorer.controls["v"].value = 0.5
    assert explorer.renders == 2 and explorer.last["value"] == 0.5
    assert explorer.last["two-pass + floor"] == pytest.approx(-0.5, abs=1e-4)


def test_figures_draw_on_their_axes(measured):
    singleton, spreads, errors, partial = measured
    fig = gs.figure_group_statistics(singleton, spreads, errors, partial)
    assert len(fig.axes) == 3 and all(ax.has_data() for ax in fig.axes)
    plt.close(fig)
    fig, ax = plt.subplots()
    gs.plot_singleton_advantages(ax, singleton[0])
    assert len(ax.patches) == 3 and len(ax.lines) == 1  # one bar per std, the exact value's line
    plt.close(fig)


def test_metrics_are_write_metrics_arguments(measured, tmp_path):
    singleton, spreads, errors, partial = measured
    written = written_metrics(gs.metrics(singleton, errors, partial), tmp_path)
    head, worst = gs.headline_rows(singleton, partial)
    assert head["value"] == 0.95 and worst["misgrouped_fraction"] == max(r["misgrouped_fraction"] for r in partial)
    assert written["reproduced"] == gs.verdict(head, worst)[0]
    assert set(written["metrics"]["singleton_advantage"]) == {"0.5", "0.95"}
    assert written["headline"]["bug"] == pytest.approx(head["one-pass"])
    assert "rewards of 0.95 in fp32" in gs.cancellation_line(8)
    assert len(gs.sweep_lines(singleton, spreads, errors, partial).splitlines()) == len(singleton) + len(errors) + len(partial)
