"""The inspector's report: the watch's ``Report`` (findings with pitfall id, severity, message and evidence; JSON and
HTML) with the dump's numbers added — ``metrics`` (verl's ``rollout_corr/`` diagnostics over the whole dump and the
``inspect/`` shares) and ``per_step`` (the ``rollout_corr/`` diagnostics of each step) — and, in ``not_observable``,
the checks the dump carried nothing for (no log-probs, no ``finish``…), each with what to add.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.core.jsonsafe import jsonable
from workbench.watch.report import Finding, Report


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
            lines.append("metrics: " + ", ".join(f"{name}={value:.4g}" for name, value in self.metrics.items()))
        return "\n".join(lines)

    def write(self, folder, title: str = "workbench inspect report") -> tuple[str, str]:
        return super().write(folder, title)
