"""What a watch reports: ``Finding`` (one pitfall seen at one call site) and ``Report`` (findings, counters
of the calls observed, and the pitfalls no observation can decide, with the ``workbench.audit`` check to run).

Plain data, JSON-safe (``to_dict``), so a report crosses process boundaries: the command-line watch writes
``report.json`` from a child process, a peer environment writes one for the lab, ranks merge theirs.
"""

from __future__ import annotations

import html
import json
import operator
import os
from dataclasses import dataclass, field

from workbench.core.jsonsafe import jsonable

SEVERITIES = ("error", "warning", "info")
SEVERITY_RANK = {severity: rank for rank, severity in enumerate(SEVERITIES)}  # 0: the most severe

# What a forward hook cannot see: how the loss is reduced. Each names the audit check that decides it. A watch adds
# entries of its own with ``check`` None when its run gave nothing to observe (P29 without a weight update: P29_UNOBSERVED).
NOT_OBSERVABLE = (
    {"pitfall": "S5", "check": "check_aggregation",
     "why": "the loss reduction over tokens and sequences happens after the forward"},
    {"pitfall": "P10", "check": "check_grad_accumulation",
     "why": "how micro-batch losses are summed across gradient accumulation happens after the forward"},
)

P29_UNOBSERVED = ("no optimiser was given and the watched model's weights did not change inside the block, so no weight "
                  "update was seen to reuse a KV cache across; pass optimizer= (a rollout engine's prefix cache, e.g. "
                  "vLLM's, is outside the watch: call reset_prefix_cache() after every weight sync)")


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
        numbers = ", ".join(f"{name}={_short(value)}" for name, value in self.evidence.items())
        return f"[{self.severity.upper()}] {self.pitfall} at {self.where}: {self.message}" + (f" ({numbers})" if numbers else "")


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list) and len(value) > 8:
        return "[" + ", ".join(_short(item) for item in value[:8]) + ", …]"
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
        return [finding for finding in self.findings if finding.severity == "error"]

    def pitfalls(self, severity: str | None = None) -> set[str]:
        """The pitfall ids found (of one severity, or all)."""
        return {finding.pitfall for finding in self.findings if severity is None or finding.severity == severity}

    def to_dict(self) -> dict:
        return {"findings": [finding.to_dict() for finding in self.findings], "observed": jsonable(self.observed),
                "not_observable": [{"pitfall": entry["pitfall"], "check": entry["check"]}
                                   | ({} if entry["check"] else {"why": entry.get("why", "")}) for entry in self.not_observable],
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
    def from_dict(cls, data: dict) -> Report:
        return cls(findings=[Finding(**finding) for finding in data.get("findings", [])], observed=dict(data.get("observed", {})),
                   not_observable=[dict(entry) for entry in data.get("not_observable", NOT_OBSERVABLE)],
                   cost=dict(data.get("cost", {})))

    @classmethod
    def merge(cls, reports, one_process: bool = False) -> Report:
        """One report from several: findings concatenated, counters and the watch's own seconds summed, modes joined.

        ``watched_seconds`` is summed over reports from separate processes (ranks, each watching its own block) and,
        with ``one_process``, is the longest block's: the watches of one process (policy and reference) watch the
        same run at once. ``not_observable``: the audit checks of every report, and a watch's own note (``check``
        None) when every report carries it (a pitfall one watch observed was observable in the run)."""
        reports = list(reports)
        merged = cls(not_observable=[])
        for report in reports:
            merged.findings += report.findings
            for name, value in report.observed.items():
                merged.observed[name] = merged.observed.get(name, 0) + value if isinstance(value, (int, float)) else value
            for name, value in report.cost.items():
                if isinstance(value, (int, float)):
                    combine = max if one_process and name == "watched_seconds" else operator.add
                    merged.cost[name] = combine(merged.cost[name], value) if name in merged.cost else value
                elif merged.cost.get(name) not in (None, value):
                    merged.cost[name] = "+".join(sorted(set(str(merged.cost[name]).split("+")) | {str(value)}))
                else:
                    merged.cost[name] = value
        carried = [{(entry["pitfall"], entry["check"]) for entry in report.not_observable} for report in reports]
        kept = set()
        for entry in [entry for report in reports for entry in report.not_observable] if reports else NOT_OBSERVABLE:
            key = (entry["pitfall"], entry["check"])
            if key not in kept and (entry["check"] or all(key in keys for keys in carried)):
                kept.add(key)
                merged.not_observable.append(dict(entry))
        return merged

    def __str__(self) -> str:
        lines = [str(finding) for finding in sorted(self.findings, key=lambda finding: SEVERITY_RANK[finding.severity])]
        if not lines:
            lines = ["no pitfall observed"]
        counts = ", ".join(f"{name}={count}" for name, count in self.observed.items() if count)
        lines.append(f"observed: {counts or 'nothing (was the model called inside the with block?)'}")
        lines += [f"not observable: {entry['pitfall']} — "
                  + (f"run workbench.audit.{entry['check']}" if entry["check"] else entry.get("why", "")) for entry in self.not_observable]
        lines += [cost] if (cost := self.cost_line()) else []
        return "\n".join(lines)

    def html(self) -> str:
        """A self-contained HTML fragment: findings table, counters, what to audit."""
        colour = {"error": "#D55E00", "warning": "#E69F00", "info": "#0072B2"}
        rows = "".join(
            f'<tr><td style="color:{colour[finding.severity]};font-weight:bold">{finding.severity}</td>'
            f"<td>{html.escape(finding.pitfall)}</td><td>{html.escape(finding.message)}</td>"
            f"<td><code>{html.escape(json.dumps(finding.evidence))}</code></td><td><code>{html.escape(finding.where)}</code></td></tr>"
            for finding in self.findings)
        rows = rows or '<tr><td colspan="5">no pitfall observed</td></tr>'
        counts = "".join(f"<li>{html.escape(str(name))}: {html.escape(str(count))}</li>" for name, count in self.observed.items())
        audits = "".join(f"<li>{html.escape(entry['pitfall'])}: run <code>workbench.audit.{html.escape(entry['check'])}</code></li>"
                         if entry["check"] else f"<li>{html.escape(entry['pitfall'])}: {html.escape(entry.get('why', ''))}</li>"
                         for entry in self.not_observable)
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
        out = {f"{prefix}{name}": float(count) for name, count in self.observed.items() if isinstance(count, (int, float))}
        out.update({f"{prefix}{severity}s": float(sum(finding.severity == severity for finding in self.findings))
                    for severity in SEVERITIES})
        for finding in self.findings:
            out[f"{prefix}{finding.pitfall}"] = out.get(f"{prefix}{finding.pitfall}", 0.0) + 1.0
        return out
