"""The run report's Exercises section and the runner's collection of the solutions' grades."""

import json
import subprocess
import sys

from workbench.catalogue import batch, report


def grades(passed: bool) -> dict:
    case = {"name": "values", "tried": "t", "expected": "e", "got": "0.5" if not passed else "1", "passed": passed}
    return {"grades": [{"exercise": "p9_k3", "passed": passed, "score": 1.0 if passed else 0.0, "cases": [case]},
                       {"exercise": "s5_grpo_loss", "passed": True, "score": 1.0, "cases": [dict(case, passed=True)]}]}


def test_section_counts_passing_solutions_and_shows_failures(tmp_path):
    page = report.write_report(tmp_path, [], total_seconds=1, smoke=True, exercises=grades(False)).read_text()
    assert "1/2 solutions pass" in page and "values: 0.5" in page and 'href="#exercises"' in page
    page = report.write_report(tmp_path, [], total_seconds=1, smoke=True, exercises=grades(True)).read_text()
    assert "2/2 solutions pass" in page
    assert "solutions pass" not in report.write_report(tmp_path, [], total_seconds=1, smoke=True).read_text()


def test_collect_reads_the_json_or_says_why_not(tmp_path):
    payload = json.dumps(grades(True)["grades"])
    ok = subprocess.Popen([sys.executable, "-c", f"open({str(tmp_path / batch.EXERCISES_JSON)!r}, 'w').write({payload!r})"])
    assert batch.collect_exercise_grading(ok, tmp_path)["grades"][0]["exercise"] == "p9_k3"
    (tmp_path / batch.EXERCISES_JSON).unlink()
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert "code 3" in batch.collect_exercise_grading(failed, tmp_path)["error"]
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    assert "longer than" in batch.collect_exercise_grading(slow, tmp_path, timeout_s=0.5)["error"]
    page = report.write_report(tmp_path, [], total_seconds=1, smoke=True, exercises={"error": "boom"}).read_text()
    assert "not graded" in page and "boom" in page
