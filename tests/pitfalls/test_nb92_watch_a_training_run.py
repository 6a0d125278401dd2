"""Notebook 92's module: the findings figure, table, explorer and the metrics the notebook writes."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.pitfalls import nb92_watch_a_training_run as p92  # noqa: E402
from workbench.watch import Finding, Report  # noqa: E402

BUG = Report(findings=[Finding("S1", "error", "no position_ids", {"left_padded_rows": 4}, "train.py:43"),
                       Finding("P7", "error", "dropout while sampling", {"dropout_max": 0.1}, "train.py:32"),
                       Finding("P7", "warning", "train mode, dropout 0", {"dropout_max": 0.0}, "train.py:50")],
             observed={"forwards": 9})
FIX = Report(findings=[Finding("P7", "warning", "train mode, dropout 0", {}, "train.py:50")], observed={"forwards": 9})


def test_counts_and_figure_stack_findings_by_pitfall_and_severity():
    assert p92.counts_by_pitfall(BUG) == {"S1": {"error": 1, "warning": 0, "info": 0}, "P7": {"error": 1, "warning": 1, "info": 0}}
    fig = p92.figure_findings({"buggy": BUG, "fixed": FIX, "empty": Report()})
    assert len(fig.axes) == 3
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert sorted(heights) == [0, 0, 0, 1, 1, 1]  # 2 pitfalls × 3 severities: S1 error, P7 error, P7 warning
    assert "2 error finding(s)" in fig.axes[0].get_title() and "0 error" in fig.axes[1].get_title()
    plt.close(fig)


def test_table_planted_and_trl_lines():
    table = p92.findings_table({"buggy": BUG, "fixed": Report()})
    assert table.count("\n") == 4 and "left_padded_rows=4" in table and "no pitfall observed" in table
    lines = p92.planted_lines(BUG, ("S1", "S3"))
    assert "planted S1: 1 error" in lines and "planted S3: MISSED" in lines and "also found: P7" in lines
    assert p92.trl_lines(None, "run_trl=False") == "TRL not shown: run_trl=False"
    assert p92.trl_lines(FIX, "trl 1.16.0").startswith("trl 1.16.0, one GRPOTrainer step")


def test_watch_explorer_redraws_another_run_and_severity():
    explorer = p92.watch_explorer({"buggy": BUG, "fixed": FIX})
    assert explorer.last == {"run": "buggy", "severity": "all", "flagged": 3}
    explorer.controls["severity"].value = "error"
    assert explorer.last["flagged"] == 2
    explorer.controls["run"].value = "fixed"
    assert explorer.renders == 3 and explorer.last == {"run": "fixed", "severity": "error", "flagged": 0}
    plt.close("all")


def test_metrics_reproduced_means_every_planted_bug_found_fixed_means_no_error(tmp_path):
    written = written_metrics(p92.metrics(BUG, FIX, ("S1", "P7"), None, "TRL cannot be imported", True), tmp_path)
    assert (written["reproduced"], written["fixed"]) == (True, True)
    assert written["headline"] == {"what": "watch findings of error severity", "unit": "findings", "bug": 2.0, "fix": 0.0}
    assert written["metrics"]["not_shown"] == ["TRL: TRL cannot be imported"] and written["metrics"]["trl"] is None
    missed = p92.metrics(BUG, BUG, ("S1", "S3"), FIX, "trl 1.16.0", True)
    assert (missed["reproduced"], missed["fixed"]) == (False, False) and missed["metrics"]["not_shown"] == []


def test_user_trainer_watched_finds_planted_bugs_and_changes_no_number():
    from workbench.audit.loading import load_module
    from workbench.core.paths import REPO_ROOT

    user = load_module(str(REPO_ROOT / "examples" / "watch_user_trainer.py"))
    report, watched = p92.run_user_trainer(user, buggy=True)
    _, plain = p92.run_user_trainer(user, buggy=True, watched=False)
    assert set(user.PLANTED) <= report.pitfalls("error") and watched == plain
