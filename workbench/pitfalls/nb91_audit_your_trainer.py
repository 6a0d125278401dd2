"""Notebook 91 (audit your own trainer): the figures, explorer and metrics of a ``workbench.audit`` run.

The checks themselves live in ``workbench.audit`` (torch + standard library only, so that they also run in
a peer's environment); what the notebook shows of their results — the buggy-vs-workbench figure, the lines
it prints, one check at a time in an explorer, and ``metrics()`` for ``metrics.json`` — lives here, beside
the pitfall modules whose checks the audit runs on a user's code.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt

from workbench.audit import AuditResult, report
from workbench.audit import run_checks as audit_run_checks
from workbench.audit import verdict as audit_verdict
from workbench.audit.suite import count_failing
from workbench.core import progress
from workbench.viz import plots
from workbench.viz.explorer import Explorer


# ---- sweeps --------------------------------------------------------------------------------------
def run_checks(callables: dict, model, tokenizer, *, label: str, **options) -> list[AuditResult]:
    """``workbench.audit.run_checks`` with a bar over the checks (the audit itself imports no progress bar)."""
    with progress.bar(len(callables), f"audit checks ({label})", unit="check") as bar:
        return audit_run_checks(callables, model, tokenizer, label=label, on_check=lambda _: bar.update(1), **options)


# ---- figures -------------------------------------------------------------------------------------
PANEL_HEIGHT = 3.4  # inches per check: the title (two lines), the axes, the tick labels and the legend below


def figure_audit(bug_results: list[AuditResult], fix_results: list[AuditResult]):
    """Every check's figure, one check per row: the buggy trainer's result on the left, the workbench's on the right
    (``plots.NOTEBOOK_WIDTH`` wide, so each text is shown at the size it was set)."""
    checks = max(len(bug_results), len(fix_results), 1)
    fig, axes = plots.panel_grid(2 * checks, columns=2, panel_height=PANEL_HEIGHT)
    for column, results in enumerate((bug_results, fix_results)):
        for ax, result in zip(axes[column::2], results, strict=False):
            result.plot(ax)
    for ax, trainer in zip(axes[:2], ("buggy trainer", "workbench"), strict=True):
        ax.annotate(trainer, (0.5, 1.0), xycoords="axes fraction", xytext=(0, 34), textcoords="offset points",
                    ha="center", va="bottom", fontsize=11, fontweight="bold")
    fig.tight_layout()
    return fig


# ---- printers ------------------------------------------------------------------------------------
def comparison_lines(bug_results: list[AuditResult], fix_results: list[AuditResult]) -> str:
    return "\n".join(f"{b.name:>17}: buggy → {b.convention} ({b.metric} = {b.value:.4g}); fixed → {f.convention} ({f.value:.4g})"
                     for b, f in zip(bug_results, fix_results, strict=False))


def trl_lines(trl_results: list[AuditResult], trl_ok: bool, trl_reason: str) -> str:
    """The TRL audit's report and each check's convention, or why TRL was skipped."""
    if not trl_results:
        return f"TRL skipped: {trl_reason if not trl_ok else 'run_trl=False'}"
    lines = [report(trl_results)]
    for r in trl_results:
        extra = f" (TRL alias {r.details['trl_alias']}, empty rows {r.details['empty_rows']})" if r.name == "aggregation" else ""
        lines.append(f"{r.details['label']}: {r.convention}{extra}")
    return "\n".join(lines)


# ---- explorer ------------------------------------------------------------------------------------
def audit_check_explorer(results: dict[str, list[AuditResult]]) -> Explorer:
    """A trainer dropdown (``{label: results}``; a label without results, e.g. TRL not installed, is left out)
    and a check dropdown: that check's figure, redrawn."""
    results = {label: rs for label, rs in results.items() if rs}
    labels = list(results)
    names = list(dict.fromkeys(r.name for rs in results.values() for r in rs))

    def draw(trainer, check):
        found = [r for r in results[trainer] if r.name == check]
        if not found:
            print(f"{trainer}: no {check} check")
            return {"trainer": trainer, "check": check, "passed": None}
        fig, ax = plt.subplots(figsize=(6, 3.6))
        found[0].plot(ax)
        ax.set_title(str(found[0])[:90], fontsize=8)
        return {"trainer": trainer, "check": check, "passed": found[0].passed, "convention": found[0].convention}

    controls = {"trainer": widgets.Dropdown(options=labels, description="trainer"),
                "check": widgets.Dropdown(options=names, description="check")}
    return Explorer(controls, draw, title="Audit: one check of one trainer")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(bug_results: list[AuditResult], fix_results: list[AuditResult], trl_results: list[AuditResult], trl_reason: str) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 91."""
    reproduced, fixed = audit_verdict(bug_results, fix_results)
    failing = count_failing(bug_results), count_failing(fix_results)
    return dict(
        notebook="91_audit_your_trainer", reproduced=reproduced, fixed=fixed,
        metrics={"failing_buggy": failing[0], "failing_fixed": failing[1], "trl": trl_reason,
                 "results": [r.to_dict() for r in bug_results + fix_results + trl_results]},
        headline={"what": "audit checks failing", "unit": "checks", "bug": failing[0], "fix": failing[1]},
    )
