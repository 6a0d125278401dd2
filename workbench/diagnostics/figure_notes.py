"""Notes that keep a figure honest about what it cannot show: a series hidden under another one, and
exact zeros on a log axis.

Why: a reader who sees one line where the legend lists two cannot tell a hidden series from a missing
one, and a zero on a log axis either vanishes or sits at an arbitrary floor that reads as a measured
value. These helpers take an ``ax`` (after its scales and limits are set) and say so on the figure:

- ``note_coinciding(ax)``: every labelled line whose points are drawn (within a couple of pixels) on
  top of another line's gets a hollow ring of its own colour around those points and a legend entry
  that says which series it coincides with;
- ``draw_floor(ax, floor)``: a labelled dotted line at the floor where exact zeros of a log axis are drawn;
- ``label_zero_bars(ax, bars)``: a "0" written at the base of every bar of height exactly 0.

They only draw; they never change the data. (They would belong in ``workbench.plots``; they live here
so that the plotting functions of the diagnostics modules can share them.)
"""

from __future__ import annotations

import re

import numpy as np

RING_SIZE_GAIN = 5  # points added to the hidden line's marker size for its ring


def _display_points(ax, line) -> np.ndarray:
    x = np.asarray(line.get_xdata(), dtype=float)
    y = np.asarray(line.get_ydata(), dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        return np.empty((0, 2))
    pts = np.column_stack([x, y])
    with np.errstate(all="ignore"):
        out = ax.transData.transform(pts)
    out[~np.isfinite(pts).all(axis=1)] = np.nan
    return out


def coinciding_points(ax, below, above, pixels: float = 2.0) -> np.ndarray:
    """Boolean mask over ``below``'s points: True where a point of ``above`` is drawn within ``pixels``."""
    a, b = _display_points(ax, below), _display_points(ax, above)
    if not len(a) or not len(b):
        return np.zeros(len(a), dtype=bool)
    dist = np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1))
    with np.errstate(invalid="ignore"):
        return np.nan_to_num(dist, nan=np.inf).min(axis=1) <= pixels


def short_name(label: str) -> str:
    """How a legend note names another series: "the fix" / "the bug" when its label says so, else its label."""
    label = re.sub(r" \(n=\d+\)$", "", label.split(" (under ")[0])  # plot_bands appends the seed count
    for tag in ("fix", "bug"):
        if label.endswith(f"({tag})") or label.endswith(f"{tag})"):
            return f"the {tag}"
    return label if len(label) <= 28 else label[:27] + "…"


def note_coinciding(ax, pixels: float = 2.0, legend_kw: dict | None = None) -> list[tuple[str, str, int]]:
    """Mark every labelled line drawn under another one; returns ``(hidden, on_top, points)`` triples.

    A line is "under" another when it comes first in drawing order (z-order, then call order). Its
    coinciding points get a hollow ring in its colour, and its legend label says
    "(under <other>, ringed)" or "(under <other> at k/n points, ringed)". The legend is redrawn
    (or drawn: ``legend_kw`` is passed to ``ax.legend``)."""
    ax.get_xlim(), ax.get_ylim()  # settle autoscaled limits before reading the data transform
    lines = [ln for ln in ax.get_lines() if not str(ln.get_label()).startswith("_")]
    order = sorted(range(len(lines)), key=lambda i: (lines[i].get_zorder(), i))
    notes = []
    for pos, i in enumerate(order):
        below = lines[i]
        for j in reversed(order[pos + 1:]):  # the topmost line that hides it
            above = lines[j]
            hit = coinciding_points(ax, below, above, pixels)
            if not hit.any():
                continue
            ring = hit.copy()
            every = below.get_markevery()
            if isinstance(every, int) and every > 1:  # ring only the points that carry a marker
                ring[np.arange(len(ring)) % every != 0] = False
            ring = ring if ring.any() else hit
            x = np.asarray(below.get_xdata(), dtype=float)[ring]
            y = np.asarray(below.get_ydata(), dtype=float)[ring]
            ax.plot(x, y, ls="none", marker="o", mfc="none", mec=below.get_color(), mew=1.5,
                    ms=max(below.get_markersize(), above.get_markersize()) + RING_SIZE_GAIN,
                    zorder=above.get_zorder() + 0.5, label="_ring")
            n, k = len(hit), int(hit.sum())
            other = short_name(str(above.get_label()))
            where = f"under {other}" if k == n else f"under {other} at {k}/{n} points"
            below.set_label(f"{below.get_label()} ({where}, ringed)")
            notes.append((str(below.get_label()), other, k))
            break
    if notes:  # the legend is where the note is read, so draw one
        ax.legend(**(legend_kw or {}))
    return notes


def draw_floor(ax, floor: float, what: str = "exactly 0") -> None:
    """A dotted grey line at ``floor`` labelled "<what>, drawn at <floor>" (for a log axis)."""
    ax.axhline(floor, color="#999999", ls=":", lw=1, zorder=0)
    ax.annotate(f"{what}, drawn at {floor:g}", (0.01, floor), xycoords=("axes fraction", "data"), xytext=(0, 3),
                textcoords="offset points", fontsize=7, color="#555555", va="bottom")


def label_zero_bars(ax, bars, text: str = "0", tol: float = 0.0) -> int:
    """Write ``text`` above every bar of height 0 (|height| ≤ ``tol``) in ``bars`` (a BarContainer); returns how many."""
    log = ax.get_yscale() == "log"  # a zero has no place on a log axis: write it at the bottom of the axes
    count = 0
    for bar in bars:
        if abs(bar.get_height()) <= tol:
            x = bar.get_x() + bar.get_width() / 2
            ax.annotate(text, (x, 0 if log else bar.get_y()), xycoords=("data", "axes fraction") if log else "data",
                        ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points",
                        color=bar.get_facecolor())
            count += 1
    return count
