"""Notebook 91's module: the audit figure, the explorer over checks and the metrics the notebook writes."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.audit import AuditResult  # noqa: E402
from workbench.pitfalls import nb91_audit_your_trainer as p91  # noqa: E402


def result(name: str, passed: bool, value: float, label: str) -> AuditResult:
    plot = {"kind": "bar", "x": ["a", "b"], "series": {"measured": [value, 0.0]}}
    return AuditResult(name=name, passed=passed, convention="masked" if passed else "unmasked",
                       details={"metric": "gap", "value": value, "label": label, "plot": plot})


BUG = [result("position_ids", False, 0.5, "buggy"), result("dpo_mask", False, 2.0, "buggy")]
FIX = [result("position_ids", True, 0.0, "workbench"), result("dpo_mask", True, 0.0, "workbench")]


def test_audit_check_explorer_redraws_another_trainer_and_check():
    explorer = p91.audit_check_explorer({"buggy": BUG, "workbench": FIX, "TRL 1.16": []})
    assert list(explorer.controls["trainer"].options) == ["buggy", "workbench"]  # no TRL results: not offered
    assert explorer.last == {"trainer": "buggy", "check": "position_ids", "passed": False, "convention": "unmasked"}
    explorer.controls["trainer"].value = "workbench"
    explorer.controls["check"].value = "dpo_mask"
    assert explorer.renders == 3 and explorer.last["passed"] is True and explorer.last["check"] == "dpo_mask"


def test_figure_draws_every_check_of_both_trainers():
    fig = p91.figure_audit(BUG, FIX)
    assert len(fig.axes) == 4 and all(ax.patches for ax in fig.axes)
    plt.close(fig)


def test_metrics_and_lines(tmp_path):
    written = written_metrics(p91.metrics(BUG, FIX, [], "TRL not installed"), tmp_path)
    assert (written["reproduced"], written["fixed"]) == (True, True)
    assert (written["metrics"]["failing_buggy"], written["metrics"]["failing_fixed"]) == (2, 0)
    assert written["headline"] == {"what": "audit checks failing", "unit": "checks", "bug": 2.0, "fix": 0.0}
    assert len(written["metrics"]["results"]) == 4 and written["metrics"]["trl"] == "TRL not installed"
    assert p91.trl_lines([], False, "TRL not installed") == "TRL skipped: TRL not installed"
    assert p91.trl_lines([], True, "") == "TRL skipped: run_trl=False"
    assert "buggy → unmasked (gap = 0.5); fixed → masked (0)" in p91.comparison_lines(BUG, FIX)
