"""viz.plots: smoothing, reserved colours and seed bands."""

import math

from workbench.viz import plots


def test_plots_smooth_is_aligned_and_colours_are_reserved():
    x, y = plots.smooth([0, 1, 2, 3, 4], 2)
    assert x == [1, 2, 3, 4] and y == [0.5, 1.5, 2.5, 3.5]
    x, y = plots.smooth([1.0, math.nan, 3.0], 1)
    assert x == [0, 1, 2] and y == [1.0, 2.0, 3.0]
    assert plots.BUG_COLOR not in plots.SERIES_COLORS[:2] and plots.FIX_COLOR not in plots.SERIES_COLORS[:2]


def test_plot_bands_draws_mean_and_band():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {"bug": [[{"step": i, "x": float(i + d)} for i in range(5)] for d in (0, 2)], "fix": [[{"step": i, "x": 0.0} for i in range(5)]]}
    fig, ax = plt.subplots()
    plots.plot_bands(ax, runs, "x", "x", window=2)
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["bug (n=2)", "fix (n=1)"]
    assert list(lines[0].get_ydata()) == [1.5, 2.5, 3.5, 4.5] and len(ax.collections) == 1  # one band: the 2-seed run
    plt.close(fig)
