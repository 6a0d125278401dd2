"""Notebook 92 (watch a training run): a user's trainer run under ``workbench.watch``, its findings as a figure,
a table and an explorer, and ``metrics()`` for ``metrics.json``.

Not a pitfall: like notebook 91 (the audit) it shows a tool that finds the catalogue's pitfalls in someone else's
code — here by observing the trainer's own forward and generate calls, with one ``with`` line and no adapters.
The trainer is a module passed in (``examples/watch_user_trainer.py``: a library module does not import the
examples), so the notebook can point the same functions at another one.
"""

from __future__ import annotations

import os
import re

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
import torch

from workbench.core import progress
from workbench.core.paths import REPO_ROOT
from workbench.viz import plots
from workbench.viz.explorer import Explorer
from workbench.watch import Report, watch
from workbench.watch.report import SEVERITIES

# ---- measurements --------------------------------------------------------------------------------
PROMPTS = ["1+2=", "12+34="]  # different lengths: the trainer pads them on the left


def run_user_trainer(user, *, buggy: bool, steps: int = 1, deep: bool = True, watched: bool = True, seed: int = 0):
    """``user.LittleGRPO`` (buggy or fixed) for ``steps`` steps on a fresh ``user.tiny_gpt2_with_dropout()``, inside
    ``with watch(model, tokenizer=tok, deep=deep)`` when ``watched``; returns (report or None, the last step's logs)."""
    torch.manual_seed(seed)
    model, tokenizer = user.tiny_gpt2_with_dropout()
    trainer = user.LittleGRPO(model, tokenizer, buggy=buggy)
    batch = {"prompts": PROMPTS, "n": 4}
    desc = f"{'buggy' if buggy else 'fixed'} trainer{', watched' if watched else ''}"
    if not watched:
        return None, [trainer.step(batch) for _ in progress.track(range(steps), desc, unit="step")][-1]
    with watch(model, tokenizer=tokenizer, deep=deep) as w:
        logs = [trainer.step(batch) for _ in progress.track(range(steps), desc, unit="step")]
    return w.report(), logs[-1]


def counts_by_pitfall(report: Report) -> dict[str, dict[str, int]]:
    """``{pitfall: {severity: call sites flagged}}``, pitfalls in the order first found."""
    counts: dict[str, dict[str, int]] = {}
    for f in report.findings:
        counts.setdefault(f.pitfall, dict.fromkeys(SEVERITIES, 0))[f.severity] += 1
    return counts


# ---- figures -------------------------------------------------------------------------------------
# Series colours, not the bug and fix ones: a severity is not "the bug" or "the fix" (an error finding in the fixed run
# would otherwise be painted as the fix).
SEVERITY_COLOURS = {"error": plots.SERIES_COLORS[0], "warning": plots.SERIES_COLORS[6], "info": plots.SERIES_COLORS[5]}


def plot_findings(ax, report: Report, title: str, severities=SEVERITIES) -> dict[str, dict[str, int]]:
    """One run's findings by pitfall, stacked by ``severities``, on ``ax``; returns ``counts_by_pitfall(report)``."""
    counts = counts_by_pitfall(report)
    pitfalls = list(counts) or ["none"]
    bottom = np.zeros(len(pitfalls))
    for severity in severities:
        heights = np.array([counts.get(p, {}).get(severity, 0) for p in pitfalls], dtype=float)
        ax.bar(pitfalls, heights, bottom=bottom, color=SEVERITY_COLOURS[severity], label=severity)
        bottom += heights
    ax.set_title(title, fontsize=10)
    ax.set_ylabel("call sites flagged")
    ax.set_ylim(0, max(1.0, bottom.max()) * 1.35)  # headroom: the legend is one row above the bars
    plots.integer_axis(ax.yaxis)
    ax.legend(fontsize=8, loc="upper center", ncol=len(severities))
    return counts


def figure_findings(reports: dict[str, Report]):
    """One panel per watched run: findings by pitfall, stacked by severity."""
    fig, axes = plt.subplots(1, len(reports), figsize=(5 * len(reports), 3.6), squeeze=False)
    for ax, (label, report) in zip(axes[0], reports.items(), strict=True):
        plot_findings(ax, report, f"{label}: {len(report.errors)} error finding(s)")
    fig.tight_layout()
    return fig


# ---- printers ------------------------------------------------------------------------------------
def without_folders(text: str) -> str:
    """``text`` naming no folder of this machine: an installed library's file from its package folder on
    (``trl/trainer/grpo_trainer.py:1498``), a file of the repository relative to it (``examples/…``)."""
    text = re.sub(r"[^\s:]*[\\/](?:site|dist)-packages[\\/]", "", text)
    return text.replace(str(REPO_ROOT) + os.sep, "")


def report_text(report: Report) -> str:
    """A watch report as it prints, with its call sites ``without_folders``."""
    return without_folders(str(report))


def findings_table(reports: dict[str, Report]) -> str:
    """Every finding of every run, one line each: run, severity, pitfall, where, evidence."""
    lines = [f"{'run':<14} {'severity':<8} {'pitfall':<7} {'where':<34} evidence"]
    for label, report in reports.items():
        if not report.findings:
            lines.append(f"{label:<14} {'—':<8} {'—':<7} {'—':<34} no pitfall observed")
        for f in report.findings:
            evidence = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in f.evidence.items())
            lines.append(f"{label:<14} {f.severity:<8} {f.pitfall:<7} {without_folders(f.where)[-34:]:<34} {evidence[:90]}")
    return "\n".join(lines)


def planted_lines(report: Report, planted) -> str:
    """Each planted bug: found (with its severities) or missed; and what was found that was not planted."""
    counts = counts_by_pitfall(report)
    lines = [f"planted {p}: " + (", ".join(f"{n} {s}" for s, n in counts[p].items() if n) if p in counts else "MISSED")
             for p in planted]
    extra = sorted(set(counts) - set(planted))
    return "\n".join(lines + ([f"also found: {', '.join(extra)}"] if extra else []))


def trl_lines(report: Report | None, reason: str) -> str:
    """The TRL run's report, or why it was not shown."""
    return f"TRL not shown: {reason}" if report is None else f"{reason}, one GRPOTrainer step with WatchCallback:\n{report_text(report)}"


# ---- explorer ------------------------------------------------------------------------------------
def watch_explorer(reports: dict[str, Report]) -> Explorer:
    """A run dropdown and a severity filter: that run's findings by pitfall, redrawn, and its findings printed."""
    def draw(run, severity):
        report = reports[run]
        shown = SEVERITIES if severity == "all" else (severity,)
        fig, ax = plt.subplots(figsize=(6, 3.4))
        counts = plot_findings(ax, report, f"{run}: {severity}", shown)
        for f in report.findings:
            if f.severity in shown:
                print(without_folders(str(f)))
        return {"run": run, "severity": severity,
                "flagged": sum(n for c in counts.values() for s, n in c.items() if s in shown)}

    controls = {"run": widgets.Dropdown(options=list(reports), description="run"),
                "severity": widgets.Dropdown(options=["all", *SEVERITIES], description="severity")}
    return Explorer(controls, draw, title="Watch: the findings of one run")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(bug: Report, fix: Report, planted, trl_report: Report | None, trl_reason: str, same_loss_unwatched: bool) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 92: reproduced = every planted bug found,
    fixed = the fixed trainer has no finding of error severity."""
    found = bug.pitfalls()
    return dict(
        notebook="92_watch_a_training_run", reproduced=set(planted) <= found, fixed=not fix.errors,
        metrics={"planted": list(planted), "found_buggy": sorted(found), "found_fixed": sorted(fix.pitfalls()),
                 "errors_buggy": len(bug.errors), "errors_fixed": len(fix.errors),
                 "same_loss_unwatched": same_loss_unwatched,
                 "not_shown": [] if trl_report is not None else [f"TRL: {trl_reason}"],
                 "buggy": bug.to_dict(), "fixed": fix.to_dict(), "trl": None if trl_report is None else trl_report.to_dict()},
        headline={"what": "watch findings of error severity", "unit": "findings", "bug": len(bug.errors), "fix": len(fix.errors)},
    )
