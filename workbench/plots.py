"""One plot style for every notebook, and plotting helpers that draw on a given ``ax``.

The bug is always drawn in ``BUG_COLOR`` (vermilion) and the fix in ``FIX_COLOR`` (blue), in
every notebook, so a reader learns the code once. Helpers never create figures themselves:
they take an ``ax`` so notebooks can lay out panels as they like.
"""

from __future__ import annotations

import matplotlib

BUG_COLOR = "#D55E00"  # vermilion (Okabe–Ito palette: colour-blind safe)
FIX_COLOR = "#0072B2"  # blue
NEUTRAL_COLOR = "#555555"
SERIES_COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]


def apply_style() -> None:
    matplotlib.rcParams.update(
        {
            "figure.figsize": (7.0, 4.0),
            "figure.dpi": 100,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.titlesize": 11,
            "axes.labelsize": 10,
            "legend.fontsize": 9,
            "legend.frameon": False,
            "axes.prop_cycle": matplotlib.cycler(color=SERIES_COLORS),
        }
    )


def bug_fix_color(bug: bool) -> str:
    return BUG_COLOR if bug else FIX_COLOR


def plot_mask(ax, mask, title: str = "", xlabel: str = "token position", ylabel: str = "row"):
    """A 0/1 mask (or any 2-D array of small integers) as an image with one cell per token."""
    import numpy as np

    array = np.asarray(mask.detach().cpu() if hasattr(mask, "detach") else mask)
    image = ax.imshow(array, cmap="Blues", vmin=0, vmax=max(1, array.max()), aspect="auto", interpolation="nearest")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(False)
    return image


def annotate_grid(ax, values, fmt: str = "{}", color: str = "black") -> None:
    """Write each value of a 2-D array in its cell of an ``imshow`` image."""
    for (row, col), value in _enumerate_2d(values):
        ax.text(col, row, fmt.format(value), ha="center", va="center", fontsize=7, color=color)


def _enumerate_2d(values):
    for i, row in enumerate(values):
        for j, value in enumerate(row):
            yield (i, j), (value.item() if hasattr(value, "item") else value)


def plot_curves(ax, history_by_label: dict, key: str, ylabel: str, colors: dict | None = None, xlabel: str = "training step"):
    """One line per run: ``history_by_label[label]`` is a list of per-step metric dicts."""
    for label, history in history_by_label.items():
        steps = [h["step"] for h in history if key in h]
        values = [h[key] for h in history if key in h]
        ax.plot(steps, values, label=label, color=(colors or {}).get(label))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
