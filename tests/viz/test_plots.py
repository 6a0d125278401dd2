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


def test_figure_row_and_panels_draw_each_axis_and_band_panels_end_with_heldout():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = [{"reward": float(s), "kl": 0.1 * s, "heldout_accuracy_start": 0.2, "heldout_accuracy": 0.5} for s in range(3)]
    runs = {"bug": [history], "fix": [history]}
    assert plots.bug_fix_colors(runs) == {"bug": plots.BUG_COLOR, "fix": plots.FIX_COLOR}
    fig = plots.figure_row(lambda axes: plots.plot_band_panels(axes, runs, (("reward", "r"), ("kl", "k")), log_key="kl"), 3, (9, 3))
    axes = fig.axes
    assert len(axes) == 3 and fig.get_size_inches().tolist() == [9, 3]
    assert axes[0].get_ylabel().startswith("r") and axes[1].get_yscale() == "log" and axes[0].get_yscale() == "linear"
    assert axes[2].get_ylabel().startswith("held-out")
    plt.close(fig)
    seen = []
    fig = plots.figure_panels((6, 2), lambda ax: seen.append(("a", ax)), lambda ax: seen.append(("b", ax)))
    assert [name for name, _ in seen] == ["a", "b"] and [ax for _, ax in seen] == fig.axes
    plt.close(fig)


def test_band_panels_short_labels_leave_the_bands_to_bands_caption():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = [{"reward": float(s), "heldout_accuracy_start": 0.2, "heldout_accuracy": 0.5} for s in range(3)]
    runs = {"bug": [history, history], "fix": [history]}
    fig, axes = plt.subplots(1, 2)
    plots.plot_band_panels(axes, runs, (("reward", "r"),), window=2, short_labels=True)
    assert axes[0].get_ylabel() == "r" and axes[1].get_ylabel() == "held-out greedy accuracy"
    plt.close(fig)
    assert plots.bands_caption(runs, 2) == "mean over 2 seeds, band ± std, 2-step moving average"
    assert plots.bands_caption({"fix": [history]}, 1) == "one seed"


def test_log_ratio_histogram_leaves_out_an_empty_series_and_clips_to_the_end_bins():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots()
    series = [(np.array([], dtype=np.float32), plots.FIX_COLOR, "fix"), (np.array([0.0, 5.0], dtype=np.float32), plots.BUG_COLOR, "bug")]
    plots.plot_log_ratio_histogram(ax, series, 0.2, np.linspace(-1.0, 1.0, 5), "log ratio")
    assert ax.get_legend_handles_labels()[1] == ["bug"] and len(ax.containers) == 1
    assert [p.get_height() for p in ax.containers[0]] == [0, 0, 1, 1]
    assert len(ax.get_lines()) == 2 and ax.get_yscale() == "log" and ax.get_ylabel() == "tokens"
    plt.close(fig)
