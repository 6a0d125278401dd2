"""What every audit check returns: ``AuditResult``, and ``report`` to tabulate several.

A result is plain data (``name``, ``passed``, ``convention``, ``details``) so it crosses process
boundaries as JSON: the peer lab runs checks inside other virtual environments (other
transformers/TRL versions) and reads the results back with ``AuditResult.from_dict``.
``details`` holds only JSON types; by convention it carries

* ``metric`` / ``value``: the one number the verdict rests on (printed by ``__str__``);
* ``plot``: a small figure spec that ``.plot(ax)`` draws — ``{"kind": "bar"|"line", "x": [...],
  "series": {label: [...]}, "xlabel", "ylabel", "title", "threshold", "log", "xlog"}`` — so a result read
  back from JSON plots exactly like the original.
"""

from __future__ import annotations

import html
import json
import textwrap
from dataclasses import dataclass, field

from workbench.core.jsonsafe import jsonable

LOG_FLOOR = 1e-9  # where a log-axis figure draws an exact zero (on a labelled dotted line)
REFERENCE_SHADES = ("#999999", "#CCCCCC")  # reference bars beside the measured one: two greys, the second hatched
REFERENCE_HATCHES = ("", "//")
# viz.plots' bug, fix and neutral colours, repeated here rather than imported: audit imports nothing above core so that
# a peer's environment runs the checks with torch alone (and viz.plots loads matplotlib and numpy at import).
# tests/audit/test_audit_plot.py checks that they equal viz.plots' BUG_COLOR, FIX_COLOR and NEUTRAL_COLOR.
FAIL_COLOR = "#D55E00"
PASS_COLOR = "#0072B2"
NEUTRAL_COLOR = "#555555"


def by_position_plot(values: list[float], label: str, xlabel: str, ylabel: str, threshold: float, title: str) -> dict:
    """The plot spec of a per-position curve on a log axis with the check's tolerance line."""
    return {"kind": "line", "x": list(range(1, len(values) + 1)), "series": {label: values}, "xlabel": xlabel,
            "ylabel": ylabel, "threshold": threshold, "log": True, "title": title}


def _format_value(value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@dataclass
class AuditResult:
    name: str
    passed: bool
    convention: str
    details: dict = field(default_factory=dict)

    def __post_init__(self):
        self.passed = bool(self.passed)
        self.details = jsonable(self.details)

    @property
    def metric(self) -> str:
        return str(self.details.get("metric", ""))

    @property
    def value(self):
        return self.details.get("value")

    def __str__(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        number = f" · {self.metric} = {_format_value(self.value)}" if self.metric else ""
        return f"[{verdict}] {self.name}: {self.convention}{number}"

    def to_dict(self) -> dict:
        return {"name": self.name, "passed": self.passed, "convention": self.convention, "details": self.details}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> AuditResult:
        missing = {"name", "passed", "convention", "details"} - set(d)
        if missing:
            raise ValueError(f"an AuditResult dict needs name, passed, convention, details; missing {sorted(missing)}")
        return cls(name=str(d["name"]), passed=bool(d["passed"]), convention=str(d["convention"]), details=dict(d["details"]))

    @classmethod
    def from_json(cls, text: str) -> AuditResult:
        return cls.from_dict(json.loads(text))

    def plot(self, ax):
        """Draw this check's figure (from ``details["plot"]``) on ``ax``; bug colour when it failed.

        Only ``ax``'s own methods: nothing of matplotlib is imported here, so the checks stay torch + stdlib."""
        spec = self.details.get("plot")
        if not spec:
            ax.text(0.5, 0.5, str(self), ha="center", va="center", transform=ax.transAxes, fontsize=8)
            ax.set_axis_off()
            return ax
        color = PASS_COLOR if self.passed else FAIL_COLOR
        x = spec.get("x", [])
        series = spec.get("series", {})
        if spec.get("kind") == "bar":
            count = max(len(series), 1)
            width = 0.8 / count
            for k, (label, values) in enumerate(series.items()):
                positions = [i + (k - (count - 1) / 2) * width for i in range(len(values))]
                shade = color if k == 0 else REFERENCE_SHADES[(k - 1) % len(REFERENCE_SHADES)]  # references: distinct greys
                bars = ax.bar(positions, [float(v) for v in values], width=width, color=shade, label=label,
                              hatch=REFERENCE_HATCHES[(k - 1) % len(REFERENCE_HATCHES)] if k else None, edgecolor="white", lw=0)
                _write_zero_bars(ax, bars)
            ax.set_xticks(range(len(x)))
            ax.set_xticklabels([str(v) for v in x], fontsize=8)
        else:
            floor = LOG_FLOOR if spec.get("log") else None  # exact zeros sit on the floor of a log axis
            for k, (label, values) in enumerate(series.items()):
                ys = [max(float(v), floor) if floor else float(v) for v in values]
                ax.plot(x[: len(values)], ys, "o-", color=color if k == 0 else NEUTRAL_COLOR, label=label, markersize=3)
            if x and len(x) <= 12 and all(isinstance(v, int) for v in x):  # positions, steps: whole-number ticks
                ax.set_xticks(x)
        if spec.get("threshold") is not None:
            ax.axhline(float(spec["threshold"]), color=NEUTRAL_COLOR, linestyle="--", linewidth=1, label="tolerance")
        if spec.get("kind") != "bar":  # after the threshold: the room under the floor is sized to the whole y range
            low = [float(v) for values in series.values() for v in values if float(v) <= (floor or 0)]
            if floor and low:
                _draw_floor(ax, floor, f"≤ {floor:g}" if any(low) else "exactly 0")
        if spec.get("log"):
            ax.set_yscale("log")
        if spec.get("xlog"):
            ax.set_xscale("log")
        ax.set_xlabel(spec.get("xlabel", ""))
        ax.set_ylabel(spec.get("ylabel", ""))
        title = spec.get("title") or self.convention
        title = "\n".join(textwrap.wrap(title, 48, max_lines=2, placeholder=" …"))  # wrapped, not cut
        ax.set_title(f"{self.name} · {'pass' if self.passed else 'FAIL'}\n{title}", fontsize=9)
        if series:  # under the axes: a legend inside would sit on the bars, or on a curve that spans the axes
            tick_lines = max([str(v).count("\n") + 1 for v in x] + [1]) if spec.get("kind") == "bar" else 1
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3 - 0.12 * (tick_lines - 1)), frameon=False)
        return ax


def _write_zero_bars(ax, bars) -> None:
    """A written "0" above each bar of height 0 (a linear axis: the log scale is set after the bars)."""
    for bar in bars:
        if bar.get_height() == 0:
            ax.annotate("0", (bar.get_x() + bar.get_width() / 2, bar.get_y()), ha="center", va="bottom", fontsize=8,
                        xytext=(0, 2), textcoords="offset points", color=bar.get_facecolor())


def _draw_floor(ax, floor: float, what: str) -> None:
    """A dotted grey line at ``floor`` on a log axis, labelled "<what>, drawn at <floor>" just under it, in room made
    below the line (the data limits reach a third of a decade per decade shown lower), where no series runs."""
    ax.axhline(floor, color="#999999", ls=":", lw=1, zorder=0)
    high = max(ax.get_ylim()[1], floor * 10)
    decades = 0
    while floor * 10 ** (decades + 1) <= high:
        decades += 1
    ax.update_datalim([(ax.get_xlim()[0], floor / 10 ** max(0.3, 0.14 * decades))], updatex=False)
    ax.autoscale_view(scalex=False)
    ax.annotate(f"{what}, drawn at {floor:g}", (0.02, floor), xycoords=("axes fraction", "data"), xytext=(0, -7),
                textcoords="offset points", fontsize=8, color=NEUTRAL_COLOR, va="top")


COLUMNS = ("check", "verdict", "convention", "metric", "value")


def _rows(results) -> list[tuple[str, ...]]:
    rows = []
    for item in results:
        result = item if isinstance(item, AuditResult) else AuditResult.from_dict(item)
        label = result.details.get("label")
        rows.append((result.name + (f" [{label}]" if label else ""), "PASS" if result.passed else "FAIL", result.convention,
                     result.metric, _format_value(result.value)))
    return rows


def report(results, fmt: str = "text") -> str:
    """A table of results (``AuditResult`` objects or their dicts): ``fmt="text"`` or ``"html"``."""
    if fmt == "html":
        return report_html(results)
    if fmt != "text":
        raise ValueError(f"fmt={fmt!r}; use 'text' or 'html'")
    rows = _rows(results)
    widths = [max([len(c)] + [len(row[i]) for row in rows]) for i, c in enumerate(COLUMNS)]
    line = "  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=False)).rstrip()
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=False)).rstrip() for row in rows]
    passed = sum(row[1] == "PASS" for row in rows)
    out.append(f"{passed}/{len(rows)} checks passed")
    return "\n".join(out)


def report_html(results) -> str:
    """The same table as an HTML fragment (no external assets)."""
    rows = _rows(results)
    head = "".join(f"<th>{c}</th>" for c in COLUMNS)
    body = []
    for row in rows:
        style = ' style="color:#0072B2"' if row[1] == "PASS" else ' style="color:#D55E00;font-weight:bold"'
        cells = [f"<td>{html.escape(v)}</td>" if i != 1 else f"<td{style}>{v}</td>" for i, v in enumerate(row)]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table class="audit-report"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
