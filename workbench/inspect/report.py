"""The inspector's report: the watch's ``Report`` (findings with pitfall id, severity, message and evidence; JSON and
HTML) with the dump's numbers added — ``metrics`` (verl's ``rollout_corr/`` diagnostics over the whole dump and the
``inspect/`` shares) and ``per_step`` (the ``rollout_corr/`` diagnostics of each step) — and, in ``not_observable``,
the checks the dump carried nothing for (no log-probs, no ``finish``…), each with what to add.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from workbench.core.jsonsafe import jsonable
from workbench.core.numbers import shown
from workbench.watch.report import Finding, Report

NOT_AT_STEP = "not measured at this step"


@dataclass
class InspectReport(Report):
    metrics: dict = field(default_factory=dict)
    per_step: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return super().to_dict() | {"metrics": jsonable(self.metrics),
                                    "per_step": {str(step): jsonable(values) for step, values in self.per_step.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> InspectReport:
        return cls(findings=[Finding(**item) for item in data.get("findings", [])], observed=dict(data.get("observed", {})),
                   not_observable=[dict(entry) for entry in data.get("not_observable", [])], cost=dict(data.get("cost", {})),
                   metrics=dict(data.get("metrics", {})), per_step={int(k): v for k, v in data.get("per_step", {}).items()})

    def scalars(self, prefix: str = "inspect/") -> dict[str, float]:
        """The findings' counts (``prefix``), the ``rollout_corr/`` diagnostics and the ``inspect/`` shares."""
        return super().scalars(prefix) | {name: float(value) for name, value in self.metrics.items()}

    def __str__(self) -> str:
        lines = super().__str__().splitlines()
        if self.metrics:
            lines.append("metrics: " + ", ".join(f"{name}={shown(value, '.4g')}" for name, value in self.metrics.items()))
        return "\n".join(lines)

    def html(self) -> str:
        """The watch's fragment, then the metrics and the per-step ``rollout_corr/`` diagnostics as tables."""
        metrics = "".join(f"<tr><td>{html.escape(name)}</td><td>{html.escape(shown(value, '.6g'))}</td></tr>"
                          for name, value in self.metrics.items())
        names = sorted({name for values in self.per_step.values() for name in values})
        header = "".join(f"<th>{html.escape(name.removeprefix('rollout_corr/'))}</th>" for name in names)

        def cell(values: dict, name: str) -> str:
            return f"<td>{html.escape(shown(values.get(name, float('nan')), '.4g', NOT_AT_STEP))}</td>"

        steps = "".join(f"<tr><td>{step}</td>" + "".join(cell(values, name) for name in names) + "</tr>"
                        for step, values in sorted(self.per_step.items()))
        return (super().html().removesuffix("</div>") + f"<p>metrics</p><table>{metrics}</table>"
                + (f"<p>rollout_corr/ by step</p><table><tr><th>step</th>{header}</tr>{steps}</table>" if steps else "")
                + "</div>")

    def write(self, folder, title: str = "workbench inspect report") -> tuple[str, str]:
        return super().write(folder, title)
