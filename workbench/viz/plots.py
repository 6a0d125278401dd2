"""One plot style for every notebook, and plotting helpers that draw on a given ``ax``.

The bug is always drawn in ``BUG_COLOR`` (vermilion) and the fix in ``FIX_COLOR`` (blue), in
every notebook, so a reader learns the code once. Helpers never create figures themselves:
they take an ``ax`` so notebooks can lay out panels as they like.

The last section keeps a figure honest about what it cannot show: a series hidden under another one
(``note_coinciding`` rings it and says so in the legend), exact zeros on a log axis (``draw_floor``:
a labelled floor line) and bars of height 0 (``label_zero_bars``: a written "0"). A reader who sees
one line where the legend lists two cannot tell a hidden series from a missing one.
"""

from __future__ import annotations

import math
import re
import textwrap

import matplotlib
import numpy as np

BUG_COLOR = "#D55E00"  # vermilion (Okabe–Ito palette: colour-blind safe)
FIX_COLOR = "#0072B2"  # blue
NEUTRAL_COLOR = "#555555"
EOS_COLOR = "#E69F00"  # orange: EOS cells in token grids
# Colours for series that are neither the bug nor the fix (modes, estimators, variants). The first two
# are not BUG_COLOR/FIX_COLOR, so a loop over modes never paints one mode as "the fix"; none is EOS_COLOR
# (index 4 is purple, not the EOS orange). Other modules pick them by index.
SERIES_COLORS = ["#882255", "#332288", "#009E73", "#CC79A7", "#AA4499", "#56B4E9", "#999933", "#000000"]
LINE_STYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v", "P"]


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


def bug_fix_colors(labels) -> dict:
    """``{bug label: BUG_COLOR, fix label: FIX_COLOR}`` for the two ``labels`` (bug first) of a comparison."""
    return dict(zip(labels, (BUG_COLOR, FIX_COLOR), strict=True))


def tagged(label: str, color) -> str:
    """``label`` with " (fix)" / " (bug)" appended when it is drawn in ``FIX_COLOR`` / ``BUG_COLOR`` and does not say so
    already: the colour code is learnt once, the legend still names it (a run label is a data key: it is not renamed)."""
    for tag, tag_color in (("fix", FIX_COLOR), ("bug", BUG_COLOR)):
        if color == tag_color and not re.search(rf"\b{tag}\b", label):
            return f"{label} ({tag})"
    return label


def plot_mask(ax, mask, title: str = "", xlabel: str = "token position", ylabel: str = "row", *, eos=None,
              key: bool = True, labels: tuple[str, str] = ("masked (0)", "in the mask (1)")):
    """A 0/1 mask as an image with one cell per token: integer ticks, a key, and (``eos``, a
    boolean array of the same shape) EOS cells in ``EOS_COLOR`` whatever their mask value, hatched
    when the mask drops them."""
    from matplotlib.colors import ListedColormap  # matplotlib: only when a figure is drawn
    from matplotlib.patches import Patch  # matplotlib: only when a figure is drawn

    array = np.asarray(mask.detach().cpu() if hasattr(mask, "detach") else mask).astype(float)
    cells = (array > 0).astype(float)
    colors = ["#f2f2f2", "#6baed6"]
    if eos is not None:
        eos = np.asarray(eos.detach().cpu() if hasattr(eos, "detach") else eos).astype(bool)
        cells = np.where(eos, 2.0, cells)
        colors.append(EOS_COLOR)
    image = ax.imshow(cells, cmap=ListedColormap(colors), vmin=-0.5, vmax=len(colors) - 0.5, aspect="auto",
                      interpolation="nearest")
    if eos is not None:
        for row, col in np.argwhere(eos & (array == 0)):
            ax.add_patch(_hatched_cell(row, col))
    integer_ticks(ax, array.shape)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(False)
    if key:
        handles = [Patch(facecolor=colors[0], edgecolor="#999999", label=labels[0]), Patch(facecolor=colors[1], label=labels[1])]
        if eos is not None:
            if (eos & (array > 0)).any():
                handles.append(Patch(facecolor=EOS_COLOR, label="EOS (in the mask)"))
            if (eos & (array == 0)).any():
                handles.append(Patch(facecolor=EOS_COLOR, hatch="///", edgecolor="black", label="EOS dropped by the mask"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return image


def _hatched_cell(row, col):
    from matplotlib.patches import Rectangle  # matplotlib: only when a figure is drawn

    return Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False, hatch="///", edgecolor="black", lw=0)


def integer_ticks(ax, shape, max_ticks: int = 12) -> None:
    """Integer tick labels on both axes of a (rows, cols) grid image, at most ``max_ticks`` each."""
    rows, cols = shape[0], shape[1]
    ax.set_xticks(range(0, cols, max(1, -(-cols // max_ticks))))
    ax.set_yticks(range(0, rows, max(1, -(-rows // max_ticks))))


def plot_positions(ax, positions, mask, title: str = "") -> None:
    """Position ids as a grid: real tokens coloured and numbered, pad cells left blank."""
    positions = np.asarray(positions.detach().cpu() if hasattr(positions, "detach") else positions)
    mask = np.asarray(mask.detach().cpu() if hasattr(mask, "detach") else mask).astype(bool)
    ax.imshow(np.ma.masked_where(~mask, positions), cmap="Blues", vmin=-2, vmax=max(1, positions[mask].max()) + 2,
              aspect="auto", interpolation="nearest")
    for (row, col), value in np.ndenumerate(positions):
        if mask[row, col]:
            ax.text(col, row, str(int(value)), ha="center", va="center", fontsize=8)
    integer_ticks(ax, positions.shape)
    ax.set_title(title)
    ax.set_xlabel("token position")
    ax.set_ylabel("row")
    ax.grid(False)


def annotate_grid(ax, values, fmt: str = "{}", color: str = "black", image=None) -> None:
    """Write each value of a 2-D array in its cell of an ``imshow`` image. With ``image`` (what ``imshow``
    returned) each label is black or white by its cell's background luminance, so it reads on pale and dark
    cells alike; otherwise every label is ``color``."""
    shown = None if image is None else np.ma.getdata(image.get_array())
    for (row, col), value in _enumerate_2d(values):
        cell_color = color if shown is None else label_color(image.cmap(image.norm(shown[row, col])))
        ax.text(col, row, fmt.format(value), ha="center", va="center", fontsize=8, color=cell_color)


def label_color(background) -> str:
    """"black" on a light ``background`` (an RGB(A) tuple in [0, 1]), "white" on a dark one (relative luminance 0.5)."""
    r, g, b = background[:3]
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 else "white"


def _enumerate_2d(values):
    for i, row in enumerate(values):
        for j, value in enumerate(row):
            yield (i, j), (value.item() if hasattr(value, "item") else value)


def smooth(values, window: int) -> tuple[list[float], list[float]]:
    """Trailing moving average: ``(x, y)`` with y[i] the mean of values[i−window+1 .. i] and x the
    index of the last value in each window, so a smoothed curve stays aligned with its raw steps."""
    values = np.asarray(values, dtype=float)
    window = max(1, min(int(window), len(values)))
    if not len(values):
        return [], []
    filled = np.where(np.isnan(values), np.nanmean(values) if np.isfinite(values).any() else 0.0, values)
    y = np.convolve(filled, np.ones(window) / window, mode="valid")
    return list(range(window - 1, len(values))), y.tolist()


def plot_curves(ax, history_by_label: dict, key: str, ylabel: str, colors: dict | None = None, xlabel: str = "training step",
                *, window: int = 1, styles: dict | None = None):
    """One line per run: ``history_by_label[label]`` is a list of per-step metric dicts.

    Runs get distinct line styles and markers (in ``styles[label]`` or by order) and the first run
    is drawn on top, so a run that coincides with another stays visible. ``window`` > 1 draws a
    trailing moving average aligned with the steps (``smooth``)."""
    for i, (label, history) in enumerate(history_by_label.items()):
        steps = [h["step"] for h in history if key in h]
        values = [h[key] for h in history if key in h]
        if window > 1:
            index, values = smooth(values, window)
            steps = [steps[j] for j in index]
        style = (styles or {}).get(label, {"ls": LINE_STYLES[i % len(LINE_STYLES)], "marker": MARKERS[i % len(MARKERS)]})
        ax.plot(steps, values, label=tagged(label, (colors or {}).get(label)), color=(colors or {}).get(label), zorder=10 - i,
                markevery=max(1, len(steps) // 8), markersize=4, **style)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel + (f" ({window}-step average)" if window > 1 else ""))
    if xlabel == "training step":
        integer_axis(ax.xaxis)
    ax.legend(loc="best")
    note_coinciding(ax, legend_kw={"loc": "best"})


def integer_axis(axis) -> None:
    """Integer ticks only on ``axis`` (``ax.xaxis``/``ax.yaxis``) for counts: steps, episodes, turns, lengths."""
    from matplotlib.ticker import MaxNLocator  # matplotlib: only when a figure is drawn

    axis.set_major_locator(MaxNLocator(integer=True))


# ---- honest figures: hidden series, zeros on log axes, zero bars -----------------------------
RING_SIZE_GAIN = 5  # points added to the hidden line's marker size for its ring
MAX_RINGS = 12  # at most this many rings per hidden line, evenly spread: 60 overlapping rings hide both lines


def in_data_coords(ax, line) -> bool:
    """True for a line drawn in data coordinates on both axes (not an ``axhline``/``axvline`` reference)."""
    return line.get_transform().contains_branch_seperately(ax.transData) == (True, True)


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
    label = re.sub(r" \(n=\d+[;)].*$", "", label.split(" (under ")[0])  # plot_bands appends the seed count
    for tag in ("fix", "bug"):
        if label.endswith(f"({tag})") or label.endswith(f"{tag})"):
            return f"the {tag}"
    return label  # whole: a truncated name ("block-diagonal 4-D mask (fi…") does not say which series hides it


LEGEND_BELOW = {"loc": "upper center", "bbox_to_anchor": (0.5, -0.2), "fontsize": 8}
LEGEND_RIGHT = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": 8}


def legend_outside(ax, where: str = "below", **kw) -> dict:
    """A legend outside the axes (``where``: "below" the x label or to the "right"), where it covers no data;
    returns its keyword arguments, to pass on as ``note_coinciding(ax, legend_kw=...)`` so the redrawn legend
    stays there. The figure's ``tight_layout`` makes room for it."""
    kw = {**(LEGEND_BELOW if where == "below" else LEGEND_RIGHT), **kw}
    ax.legend(**kw)
    return kw


def note_coinciding(ax, pixels: float = 2.0, legend_kw: dict | None = None, *,
                    ring_only: bool = False) -> list[tuple[str, str, int]]:
    """Mark every labelled line drawn under another one; returns ``(hidden, on_top, points)`` triples.

    A line is "under" another when it comes first in drawing order (z-order, then call order). Its
    coinciding points get a hollow ring in its colour (at most ``MAX_RINGS``, evenly spread), and its legend label says
    "(under <other>, ringed)" or "(under <other> at k/n points, ringed)". The legend is redrawn
    (or drawn: ``legend_kw`` is passed to ``ax.legend``).

    ``ring_only``: draw the rings and leave the labels and the legend as they are, for a figure whose legend is shared
    by several panels and whose caption says what a ring means.

    Reference lines (``axhline``/``axvline``: one coordinate in axes fractions) are neither hidden nor
    hiding: a thin reference drawn across a series does not hide it. A line already noted (its label says
    ", ringed)") is not noted again, so calling this twice on an axis is harmless."""
    ax.get_xlim(), ax.get_ylim()  # settle autoscaled limits before reading the data transform
    lines = [ln for ln in ax.get_lines() if not str(ln.get_label()).startswith("_") and in_data_coords(ax, ln)]
    order = sorted(range(len(lines)), key=lambda i: (lines[i].get_zorder(), i))
    notes = []
    for pos, i in enumerate(order):
        below = lines[i]
        if str(below.get_label()).endswith(", ringed)"):
            continue
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
            where_ringed = np.flatnonzero(ring)
            if len(where_ringed) > MAX_RINGS:  # thin evenly, keeping the first and the last
                keep = where_ringed[np.unique(np.linspace(0, len(where_ringed) - 1, MAX_RINGS).round().astype(int))]
                ring = np.zeros_like(ring)
                ring[keep] = True
            x = np.asarray(below.get_xdata(), dtype=float)[ring]
            y = np.asarray(below.get_ydata(), dtype=float)[ring]
            ax.plot(x, y, ls="none", marker="o", mfc="none", mec=below.get_color(), mew=1.5,
                    ms=max(below.get_markersize(), above.get_markersize()) + RING_SIZE_GAIN,
                    zorder=above.get_zorder() + 0.5, label="_ring")
            n, k = len(hit), int(hit.sum())
            other = short_name(str(above.get_label()))
            where = f"under {other}" if k == n else f"under {other} at {k}/{n} points"
            if not ring_only:
                below.set_label(f"{below.get_label()} ({where}, ringed)")
            notes.append((str(below.get_label()), other, k))
            break
    if notes and not ring_only:  # the legend is where the note is read, so draw one
        ax.legend(**(legend_kw or {}))
    return notes


def draw_floor(ax, floor: float, what: str = "exactly 0") -> None:
    """A dotted grey line at ``floor`` (on a log axis) labelled "<what>, drawn at <floor>" just under it, in room
    made below the line, so the label sits where no series runs (a series at the floor runs on the line)."""
    floor_notes(ax, floor, [(f"{what}, drawn at {floor:g}", "#555555")])


def floor_notes(ax, floor: float, notes: list[tuple[str, str]]) -> None:
    """A dotted grey line at ``floor`` (> 0, on a log axis, set before or after) and each ``(text, color)`` of
    ``notes`` written under it, one per row, in room made below the line by extending the data limits (autoscaling
    stays on for series drawn later)."""
    ax.axhline(floor, color="#999999", ls=":", lw=1, zorder=0)
    span = max(np.log10(max(ax.get_ylim()[1], floor) / floor), 1.0)
    bottom = floor / 10 ** (max(0.3, 0.14 * span) * len(notes))  # ~12% of the axes height per note
    ax.update_datalim(np.array([[ax.get_xlim()[0], bottom]]), updatex=False)
    ax.autoscale_view(scalex=False)
    for k, (text, color) in enumerate(notes):
        ax.annotate(text, (0.02, floor), xycoords=("axes fraction", "data"), xytext=(0, -7 - 10 * k),
                    textcoords="offset points", va="top", fontsize=8, color=color)


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


# --------------------------------------------------------------------------------------------
# Multi-seed runs ({label: [history per seed]}, plain data from experiments.comparison)
# --------------------------------------------------------------------------------------------
def plot_bands(ax, runs: dict[str, list[list[dict]]], key: str, ylabel: str, colors: dict | None = None, *,
               window: int = 1, styles: dict | None = None, log: bool = False, legend_kw: dict | None = None) -> None:
    """Mean over seeds per variant (a line, aligned moving average when ``window`` > 1, said in the
    y-label) with a ± std band; one seed draws the line alone. ``styles[label]`` replaces the line
    style and marker chosen by order. A variant drawn under another one is ringed and said in the legend
    (``note_coinciding``).

    ``log``: a log y-axis, where a ± std band would dip below 0 and draw false stripes and exact zeros
    would vanish: the band is then the min–max over seeds, and values ≤ 0 are drawn at a floor, a power
    of ten at least two decades below the smallest positive value (``log_floor``), marked by a dotted
    line. A variant that is exactly 0 throughout says so in the legend and in a note under the floor line,
    where no series runs. ``legend_kw`` places the legend (default: "best" inside; below the axes when a floor
    note runs under the floor line)."""
    series = {label: np.array([[h[key] for h in run] for run in histories], dtype=float) for label, histories in runs.items()}
    positive = np.concatenate([v[v > 0] for v in series.values()] + [np.array([])])
    floor = log_floor(positive) if log else 0.0
    floored = []  # (label, steps at the floor, steps): the notes under the floor line
    for i, (label, values) in enumerate(series.items()):
        x, mean = smooth(np.nanmean(values, axis=0), window)
        mean = np.asarray(mean, dtype=float)
        color = (colors or {}).get(label)
        style = (styles or {}).get(label, {"ls": LINE_STYLES[i % 4], "marker": MARKERS[i % 6]})
        name = tagged(label, color)
        shown = f"{name} (n={len(values)})"
        if log and (mean <= floor).any():
            all_zero = bool(np.all(values[np.isfinite(values)] <= 0))
            floored.append((name, int((mean <= floor).sum()), len(mean), all_zero, color))
            if all_zero:
                shown = f"{name} (n={len(values)}; exactly 0, drawn at {floor:.0e})"
        line, = ax.plot(x, np.maximum(mean, floor) if log else mean, markevery=max(1, len(x) // 8), markersize=4, color=color,
                        zorder=10 - i, label=shown, **style)
        if len(values) > 1:
            if log:
                low, high = (np.asarray(smooth(f(values, axis=0), window)[1], dtype=float) for f in (np.nanmin, np.nanmax))
                low, high = np.maximum(low, floor), np.maximum(high, floor)
            else:
                std = np.asarray(smooth(np.nanstd(values, axis=0, ddof=1), window)[1], dtype=float)
                low, high = mean - std, mean + std
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.15, lw=0)
    ax.set_xlabel("training step")
    integer_axis(ax.xaxis)
    notes = []
    if max(len(v) for v in series.values()) > 1:
        notes.append("mean; band: min–max over seeds" if log else "mean ± std over seeds")
    if window > 1:
        notes.append(f"{window}-step moving average")
    ax.set_ylabel(ylabel + (f" ({', '.join(notes)})" if notes else ""))
    legend = legend_kw or {"fontsize": 8, "loc": "best"}
    if log:
        ax.set_yscale("log")
        if floored:  # the notes run under the floor line: the legend goes below the axes, off the notes and the data
            _note_floor(ax, floor, floored)
            legend = legend_kw or LEGEND_BELOW
    ax.legend(**legend)
    note_coinciding(ax, legend_kw=legend)


def log_floor(positive) -> float:
    """Where a log axis draws values ≤ 0: a power of ten at least two decades below the smallest of
    ``positive`` (1e-12 when there is none), so a zero never reads as a small real value."""
    positive = np.asarray(positive, dtype=float)
    positive = positive[np.isfinite(positive) & (positive > 0)]
    if not positive.size:
        return 1e-12
    return float(10.0 ** (np.floor(np.log10(positive.min())) - 2))


def _note_floor(ax, floor: float, floored) -> None:
    """``floor_notes`` for ``plot_bands``: one short note per variant drawn at the floor somewhere (the legend
    says the rest), short so that a "best" legend finds room beside it."""
    notes = []
    for label, at_floor, steps, all_zero, color in floored:
        what = "exactly 0 at every step" if all_zero else f"≤ 0 at {at_floor}/{steps} points"
        notes.append((f"{short_name(label)}: {what}, drawn on this line", color or NEUTRAL_COLOR))
    floor_notes(ax, floor, notes)


def plot_heldout(ax, runs: dict[str, list[list[dict]]], colors: dict | None = None) -> None:
    """Held-out greedy accuracy before and after training per variant: one dot per seed, mean ± std bar."""
    for i, (label, histories) in enumerate(runs.items()):
        start = np.array([h[-1]["heldout_accuracy_start"] for h in histories], dtype=float)
        end = np.array([h[-1]["heldout_accuracy"] for h in histories], dtype=float)
        color = (colors or {}).get(label)
        for j, (values, x) in enumerate(((start, i - 0.15), (end, i + 0.15))):
            std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
            ax.errorbar([x], [values.mean()], yerr=[std], fmt="o" if j else "s", mfc="none" if j == 0 else color,
                        color=color or "0.3", capsize=4, zorder=3)
            ax.scatter(np.full(len(values), x + 0.06), values, s=10, color=color or "0.3", alpha=0.6, zorder=2)
    wrap = 16 if len(runs) > 3 else 32  # many variants: wrap their names so neighbouring tick labels do not overlap
    names = [tagged(label, (colors or {}).get(label)) for label in runs]
    ax.set_xticks(range(len(runs)), [f"{textwrap.fill(name, wrap)}\n(start □ → end ●)" for name in names], fontsize=8)
    ax.set_ylabel("held-out greedy accuracy" + (" (mean ± std, dots: seeds)" if max(len(h) for h in runs.values()) > 1 else ""))


def plot_band_panels(axes, runs: dict[str, list[list[dict]]], panels, colors: dict | None = None, *,
                     window: int = 1, log_key: str | None = None, legend_kw: dict | None = None,
                     short_labels: bool = False) -> None:
    """``plot_bands`` of each ``(key, label)`` of ``panels`` on its axis (a log axis for ``log_key``, the legend placed by
    ``legend_kw``), then ``plot_heldout`` on the next axis: the training figure of a bug-vs-fix comparison.

    ``short_labels``: each band's y label is its panel label alone and the held-out one "held-out greedy accuracy",
    without how the bands were made, for a figure whose caption says that (``bands_caption``)."""
    for ax, (key, label) in zip(axes, panels, strict=False):
        plot_bands(ax, runs, key, label, colors, window=window, log=key == log_key, legend_kw=legend_kw)
        if short_labels:
            ax.set_ylabel(label)
    plot_heldout(axes[len(panels)], runs, colors)
    if short_labels:
        axes[len(panels)].set_ylabel("held-out greedy accuracy")


def label_switch_heldout(ax, runs: dict[str, list[list[dict]]], switch: str) -> None:
    """Short labels for a ``plot_heldout`` axis whose variants are the values of one trainer switch (labels
    "... switch=value"): each tick the value alone, one word a line, and the switch named once in the x label."""
    ax.set_xticks(range(len(runs)), [re.sub(r"^.*=", "", label).replace(" ", "\n") for label in runs], fontsize=9)
    ax.set_xlabel(f"{switch} (□ start → ● end)")
    ax.set_ylabel("held-out accuracy")


def bands_caption(runs: dict[str, list[list[dict]]], window: int) -> str:
    """How ``plot_bands`` drew ``runs``, for a caption under short y labels: "mean over N seeds, band ± std" (N the
    most seeds of any variant) or "one seed", then ", W-step moving average" when ``window`` > 1."""
    seeds = max(len(histories) for histories in runs.values())
    spread = f"mean over {seeds} seeds, band ± std" if seeds > 1 else "one seed"
    return spread + (f", {window}-step moving average" if window > 1 else "")


def plot_log_ratio_histogram(ax, series, clip: float, edges, xlabel: str) -> None:
    """Histogram of per-token log-ratios on a log count axis, one per ``(values, color, label)`` of ``series`` in that
    order (a series without values is left out, legend entry and all), and PPO's clip window [log(1 − clip),
    log(1 + clip)] dashed. ``edges`` are the bins from −1 to 1 (the caller's, so that every figure of a notebook bins
    alike); values beyond ±1 are drawn in the end bins."""
    for values, color, label in series:
        values = np.asarray(values)
        if values.size:
            ax.hist(np.clip(values, -1, 1), bins=edges, color=color, alpha=0.6, label=label)
    for edge in (math.log(1 - clip), math.log(1 + clip)):
        ax.axvline(edge, color=NEUTRAL_COLOR, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("tokens")


NOTEBOOK_WIDTH = 9.6  # inches: at 100 dpi, with savefig's 0.1-in pads, a figure fills a 1000-px output area unshrunk


def panel_grid(panels: int, *, columns: int | None = None, panel_height: float = 3.2, width: float = NOTEBOOK_WIDTH,
               **subplot_kw):
    """A figure of ``panels`` axes in rows that fit a notebook's output area (``viz.legibility``): ``width`` inches
    wide (at most ``NOTEBOOK_WIDTH``, so its text is shown at the size it was set), ``columns`` per row (default: all
    of 1–3 panels in one row, 4 as 2 × 2, more in rows of 3), each row ``panel_height`` inches high. Returns
    ``(fig, axes)``, ``axes`` a flat array of exactly ``panels`` axes (the grid's spare cells removed)."""
    import matplotlib.pyplot as plt  # matplotlib: only when a figure is drawn

    columns = columns or (panels if panels <= 3 else 2 if panels == 4 else 3)
    rows = -(-panels // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(min(width, NOTEBOOK_WIDTH), panel_height * rows), squeeze=False,
                             **subplot_kw)
    flat = axes.ravel()
    for spare in flat[panels:]:
        spare.remove()
    return fig, flat[:panels]


def figure_legend(fig, axes, ncol: int | None = None, *, labels: list[str] | None = None) -> None:
    """One legend for the whole figure, under its panels: the labelled artists and legend entries of ``axes`` (one axis
    or several; a label found on several panels once), every panel's own legend removed, ``labels`` (in order) in place
    of their labels, else their labels without the seed count and "(under …, ringed)" notes, which the caption printed
    under the figure gives; ``ncol`` entries per row (default all in one)."""
    key = {}
    for axis in np.atleast_1d(axes):
        handles, texts = axis.get_legend_handles_labels()
        legend = axis.get_legend()
        if legend is not None:  # a legend of proxy artists (a colour key) holds entries no artist of the axis carries
            handles, texts = handles + list(legend.legend_handles), texts + [t.get_text() for t in legend.get_texts()]
        for handle, text in zip(handles, texts, strict=True):
            key.setdefault(text, handle)
    for axis in fig.axes:
        if axis.get_legend() is not None:
            axis.get_legend().remove()
    labels = list(labels) if labels is not None else [re.sub(r" \((n=|under ).*$", "", text) for text in key]
    ncol = ncol or len(labels)
    fig.legend(list(key.values())[:len(labels)], labels, loc="lower center", ncol=ncol, fontsize=9, frameon=False)
    rows = -(-len(labels) // ncol)
    fig.tight_layout(rect=(0, (0.15 + 0.22 * rows) / fig.get_size_inches()[1], 1, 1))


def figure_row(draw, ncols: int, figsize: tuple[float, float], columns: int | None = None):
    """A figure of ``ncols`` axes drawn by ``draw(axes)`` (a flat array), laid out by ``panel_grid`` (rows that fit a
    notebook: ``figsize`` is the width asked for, at most ``NOTEBOOK_WIDTH``, and each row's height) and tight: what a
    ``figure_*`` of a pitfall module builds from its ``plot_*(axes, …)`` function."""
    fig, axes = panel_grid(ncols, columns=columns, panel_height=figsize[1], width=figsize[0])
    draw(axes)
    fig.tight_layout()
    return fig


def figure_panels(figsize: tuple[float, float], *draws):
    """``figure_row`` of one axis per ``draw(ax)`` callable, in reading order (one callable: a one-axis figure)."""
    return figure_row(lambda axes: [draw(ax) for draw, ax in zip(draws, np.atleast_1d(axes), strict=True)], len(draws), figsize)
