"""Is a figure readable where a reader sees it: in a notebook's output area, about 1000 pixels wide?

JupyterLab shows a figure's PNG at one pixel per pixel (the inline backend renders at the figure's dpi, 100 under
``plots.apply_style``) and scales a wider one down to the output area, so every text shrinks with it: a 9-pt legend in
a 20-inch figure reads as 4.5 pt. ``check_figure`` draws the figure once with a renderer that records every text it
really draws (tick labels outside the view are not drawn, so not counted) and reports

* **small text**: a text whose size *as shown* (its point size × the scale at ``SHOWN_WIDTH_PX``) is under
  ``MIN_SHOWN_PT``;
* **overlapping text**: two drawn texts whose boxes overlap by more than ``OVERLAP_PX`` pixels each way, or a legend's
  box over a text that is not its own (a legend over tick labels or a neighbour's label);
* **repeated tick labels**: one numeric axis that writes the same label twice (a log axis over a flat range writes
  ``3.4×10⁻²`` at every minor tick); labels the figure set itself (tokens, names) may repeat.

The boxes are matplotlib's own (``Text.get_window_extent``), measured after the layout the figure was saved with.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.legend import Legend
from matplotlib.text import Text
from matplotlib.ticker import EngFormatter, LogFormatter, PercentFormatter, ScalarFormatter

SHOWN_WIDTH_PX = 1000  # JupyterLab's output area on a laptop screen
MIN_SHOWN_PT = 8.0  # the smallest text a reader is asked to read
OVERLAP_PX = 1.0  # boxes touching by a pixel are not an overlap
PAD_INCHES = 0.1  # savefig(bbox_inches="tight")'s margin on each side


@dataclass
class FigureCheck:
    """What ``check_figure`` found on one figure; ``problems()`` says it in words (empty: readable)."""

    name: str
    width_px: float
    """The saved (tight) figure's width in pixels at its dpi."""
    scale: float
    """How much the output area shrinks it: min(1, ``SHOWN_WIDTH_PX`` / ``width_px``)."""
    smallest_shown_pt: float
    small_texts: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    repeated_ticks: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        found = []
        if self.small_texts:
            found.append(f"{len(self.small_texts)} text(s) under {MIN_SHOWN_PT:g} pt as shown (figure {self.width_px:.0f} px "
                         f"wide, shown at {self.scale:.2f}×): {', '.join(self.small_texts[:4])}")
        if self.overlaps:
            found.append(f"{len(self.overlaps)} overlapping text(s): {'; '.join(self.overlaps[:4])}")
        if self.repeated_ticks:
            found.append(f"repeated tick labels: {'; '.join(self.repeated_ticks)}")
        return found

    def as_dict(self) -> dict:
        return {**asdict(self), "problems": self.problems()}


def _drawn_texts(fig) -> tuple[list[tuple[Text, float]], RendererAgg]:
    """Every text the figure draws, with its size in points, in drawing order: the figure drawn once on an Agg renderer
    whose ``draw_text`` records the artist (multi-line texts call it once per line; kept once)."""
    renderer = RendererAgg(int(fig.bbox.width), int(fig.bbox.height), fig.dpi)
    drawn: dict[int, tuple[Text, float]] = {}
    draw_text = renderer.draw_text

    def record(gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if mtext is not None and str(s).strip() and id(mtext) not in drawn:
            drawn[id(mtext)] = (mtext, prop.get_size_in_points())
        return draw_text(gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)

    renderer.draw_text = record
    fig.draw(renderer)
    return list(drawn.values()), renderer


def _label(text: Text) -> str:
    words = " ".join(text.get_text().split())
    return repr(words if len(words) <= 30 else words[:29] + "…")


def _overlap(a, b) -> bool:
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > OVERLAP_PX) and (min(a.y1, b.y1) - max(a.y0, b.y0) > OVERLAP_PX)


def _owner_legend(text: Text, legends: list[Legend]) -> Legend | None:
    for legend in legends:
        if text in legend.texts or text is legend.get_title():
            return legend
    return None


NUMERIC_FORMATTERS = (ScalarFormatter, LogFormatter, EngFormatter, PercentFormatter)


def _numeric_tick_labels(fig):
    """``(axis name, {ids of tick label artists written by a numeric formatter})`` for every x and y axis: labels the
    figure set itself (``set_xticks(ticks, labels)``: tokens, names) are left out, a repeat among them is the data's."""
    for index, ax in enumerate(fig.axes):
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            labels = set()
            for ticks, formatter in ((axis.get_major_ticks(), axis.get_major_formatter()),
                                     (axis.get_minor_ticks(), axis.get_minor_formatter())):
                if isinstance(formatter, NUMERIC_FORMATTERS):
                    for tick in ticks:
                        labels.update((id(tick.label1), id(tick.label2)))
            yield f"axes {index} {name}", labels


def check_figure(fig, name: str = "") -> FigureCheck:
    """Draw ``fig`` once and measure what a reader of a 1000-px output area sees (module docstring)."""
    texts, renderer = _drawn_texts(fig)
    tight = fig.get_tightbbox(renderer)
    width_px = (tight.width + 2 * PAD_INCHES) * fig.dpi
    scale = min(1.0, SHOWN_WIDTH_PX / width_px) if width_px > 0 else 1.0
    shown = [(text, size * scale) for text, size in texts]
    check = FigureCheck(name=name, width_px=round(width_px, 1), scale=round(scale, 3),
                        smallest_shown_pt=round(min((s for _, s in shown), default=0.0), 2))
    check.small_texts = [f"{_label(t)} {s:.1f} pt" for t, s in shown if s < MIN_SHOWN_PT - 1e-6]

    legends = [a for a in fig.findobj(Legend) if a.get_visible()]
    boxes = [(text, text.get_window_extent(renderer)) for text, _ in texts]
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1:]:
            if _overlap(box_a, box_b):
                check.overlaps.append(f"{_label(a)} over {_label(b)}")
    for legend in legends:
        frame = legend.get_window_extent(renderer)
        for text, box in boxes:
            if _owner_legend(text, [legend]) is None and _overlap(frame, box):
                check.overlaps.append(f"a legend over {_label(text)}")

    for where, label_ids in _numeric_tick_labels(fig):
        seen: dict[str, int] = {}
        for text, _ in texts:
            if id(text) in label_ids:
                seen[text.get_text()] = seen.get(text.get_text(), 0) + 1
        repeated = sorted(label for label, count in seen.items() if count > 1)
        if repeated:
            check.repeated_ticks.append(f"{where}: {', '.join(repr(r) for r in repeated)}")
    return check

