"""What a watch reports: ``Finding`` (one pitfall seen at one call site) and ``Report`` (findings, counters
of the calls observed, and the pitfalls no observation can decide, with the ``workbench.audit`` check to run).

Plain data, JSON-safe (``to_dict``), so a report crosses process boundaries: the command-line watch writes
``report.json`` from a child process, a peer environment writes one for the lab, ranks merge theirs.
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass, field

from workbench.core.jsonsafe import jsonable

SEVERITIES = ("error", "warning", "info")

# What a forward hook cannot see: how the loss is reduced. Each names the audit check that decides it. A watch adds
# entries of its own with ``check`` None when its run gave nothing to observe (P29 without a weight update).
NOT_OBSERVABLE = (
    {"pitfall": "S5", "check": "check_aggregation",
     "why": "the loss reduction over tokens and sequences happens after the forward"},
    {"pitfall": "P10", "check": "check_grad_accumulation",
     "why": "how micro-batch losses are summed across gradient accumulation happens after the forward"},
)


@dataclass
class Finding:
    pitfall: str
    severity: str
    message: str
    evidence: dict = field(default_factory=dict)
    where: str = "?"

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity={self.severity!r}; use one of {SEVERITIES}")
        self.evidence = jsonable(self.evidence)

    def to_dict(self) -> dict:
        return {"pitfall": self.pitfall, "severity": self.severity, "message": self.message,
                "evidence": self.evidence, "where": self.where}

    def __str__(self) -> str:
        numbers = ", ".join(f"{k}={_short(v)}" for k, v in self.evidence.items())
        return f"[{self.severity.upper()}] {self.pitfall} at {self.where}: {self.message}" + (f" ({numbers})" if numbers else "")


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list) and len(value) > 8:
        return "[" + ", ".join(_short(v) for v in value[:8]) + ", …]"
    return str(value)


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    observed: dict = field(default_factory=dict)
    not_observable: list[dict] = field(default_factory=lambda: [dict(n) for n in NOT_OBSERVABLE])
    cost: dict = field(default_factory=dict)
    """What watching cost: ``watch_seconds`` (wall time inside the watch's hooks and event handlers),
    ``watched_seconds`` (wall time of the ``with`` block so far), ``mode`` ("light" or "deep"), ``device`` (the
    model's). On CUDA the hooks' time includes waiting for the GPU work queued before them (they read a few
    values back), so there it is an upper bound."""

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def pitfalls(self, severity: str | None = None) -> set[str]:
        """The pitfall ids found (of one severity, or all)."""
        return {f.pitfall for f in self.findings if severity is None or f.severity == severity}

    def to_dict(self) -> dict:
        return {"findings": [f.to_dict() for f in self.findings], "observed": jsonable(self.observed),
                "not_observable": [{"pitfall": n["pitfall"], "check": n["check"]} | ({} if n["check"] else {"why": n.get("why", "")})
                                   for n in self.not_observable],
                "cost": jsonable(self.cost)}

    def cost_line(self) -> str:
        """"watch cost (deep): 12.3 ms in its hooks over 1.20 s watched (1.0 %)", or "" when nothing was timed."""
        own, watched = self.cost.get("watch_seconds"), self.cost.get("watched_seconds")
        if own is None or not watched:
            return ""
        bound = " at most" if self.cost.get("device") == "cuda" else ""  # the hooks also wait for queued GPU work
        return (f"watch cost ({self.cost.get('mode', '?')}):{bound} {1000 * own:.1f} ms in its hooks over {watched:.2f} s watched "
                f"({100 * own / watched:.1f} %)")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, d: dict) -> Report:
        return cls(findings=[Finding(**f) for f in d.get("findings", [])], observed=dict(d.get("observed", {})),
                   not_observable=[dict(n) for n in d.get("not_observable", NOT_OBSERVABLE)], cost=dict(d.get("cost", {})))

    @classmethod
    def merge(cls, reports) -> Report:
        """One report from several (e.g. one per rank): findings concatenated, counters summed."""
        merged = cls()
        for r in reports:
            merged.findings += r.findings
            for k, v in r.observed.items():
                merged.observed[k] = merged.observed.get(k, 0) + v if isinstance(v, (int, float)) else v
            for k, v in r.cost.items():  # seconds summed over ranks (each rank watched its own block); modes joined
                if isinstance(v, (int, float)):
                    merged.cost[k] = merged.cost.get(k, 0.0) + v
                elif merged.cost.get(k) not in (None, v):
                    merged.cost[k] = "+".join(sorted(set(str(merged.cost[k]).split("+")) | {str(v)}))
                else:
                    merged.cost[k] = v
        return merged

    def __str__(self) -> str:
        lines = [str(f) for f in sorted(self.findings, key=lambda f: SEVERITIES.index(f.severity))]
        if not lines:
            lines = ["no pitfall observed"]
        counts = ", ".join(f"{k}={v}" for k, v in self.observed.items() if v)
        lines.append(f"observed: {counts or 'nothing (was the model called inside the with block?)'}")
        lines += [f"not observable: {n['pitfall']} — " + (f"run workbench.audit.{n['check']}" if n["check"] else n.get("why", ""))
                  for n in self.not_observable]
        lines += [cost] if (cost := self.cost_line()) else []
        return "\n".join(lines)

    def html(self) -> str:
        """A self-contained HTML fragment: findings table, counters, what to audit."""
        colour = {"error": "#D55E00", "warning": "#E69F00", "info": "#0072B2"}
        rows = "".join(
            f'<tr><td style="color:{colour[f.severity]};font-weight:bold">{f.severity}</td><td>{html.escape(f.pitfall)}</td>'
            f"<td>{html.escape(f.message)}</td><td><code>{html.escape(json.dumps(f.evidence))}</code></td>"
            f"<td><code>{html.escape(f.where)}</code></td></tr>"
            for f in self.findings)
        rows = rows or '<tr><td colspan="5">no pitfall observed</td></tr>'
        counts = "".join(f"<li>{html.escape(str(k))}: {html.escape(str(v))}</li>" for k, v in self.observed.items())
        audits = "".join(f"<li>{html.escape(n['pitfall'])}: run <code>workbench.audit.{html.escape(n['check'])}</code></li>"
                         if n["check"] else f"<li>{html.escape(n['pitfall'])}: {html.escape(n.get('why', ''))}</li>"
                         for n in self.not_observable)
        return ('<div class="watch-report"><table><thead><tr><th>severity</th><th>pitfall</th><th>message</th>'
                f"<th>evidence</th><th>where</th></tr></thead><tbody>{rows}</tbody></table>"
                f"<p>observed</p><ul>{counts}</ul><p>not observable by a watch</p><ul>{audits}</ul>"
                + (f"<p>{html.escape(cost)}</p>" if (cost := self.cost_line()) else "") + "</div>")

    def _repr_html_(self) -> str:
        return self.html()

    def page(self, title: str = "workbench.watch report") -> str:
        """A standalone HTML page around ``html()`` (what ``write`` saves as report.html)."""
        style = ("body{font-family:sans-serif;margin:2em}td,th{border:1px solid #ccc;padding:4px;vertical-align:top}"
                 "table{border-collapse:collapse}")
        return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title><style>{style}</style></head>"
                f"<body><h1>{html.escape(title)}</h1>{self.html()}</body></html>\n")

    def write(self, folder, title: str = "workbench.watch report") -> tuple[str, str]:
        """Write ``report.json`` and ``report.html`` into ``folder`` (created); returns their paths."""
        os.makedirs(folder, exist_ok=True)
        paths = os.path.join(folder, "report.json"), os.path.join(folder, "report.html")
        for path, text in zip(paths, (self.to_json() + "\n", self.page(title)), strict=True):
            with open(path + ".tmp", "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(path + ".tmp", path)
        return paths

    def scalars(self, prefix: str = "watch/") -> dict[str, float]:
        """Numbers a training logger can plot: every counter, findings by severity, and per pitfall the
        number of call sites flagged."""
        out = {f"{prefix}{k}": float(v) for k, v in self.observed.items() if isinstance(v, (int, float))}
        out.update({f"{prefix}{severity}s": float(sum(f.severity == severity for f in self.findings)) for severity in SEVERITIES})
        for f in self.findings:
            out[f"{prefix}{f.pitfall}"] = out.get(f"{prefix}{f.pitfall}", 0.0) + 1.0
        return out
