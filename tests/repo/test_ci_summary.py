"""The last line of CI (scripts/ci_summary.py): peer probes and browser test run or skipped, read from pytest's JUnit XML."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ci_summary.py"
spec = importlib.util.spec_from_file_location("ci_summary", SCRIPT)
ci_summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ci_summary)

XML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_peer_lab" name="test_rows" time="0.1"/>
<testcase classname="tests.test_peer_lab" name="test_trl_release" time="0.0">
  <skipped type="pytest.skip" message="no environment trl-0.11.4 (run `make peers`)">x</skipped></testcase>
<testcase classname="tests.test_peer_envs" name="test_spec" time="0.1"/>
<testcase classname="tests.test_browser" name="test_quickstart" time="0.0">
  <skipped type="pytest.skip" message="Skipped: /usr/bin/chromium is absent">x</skipped></testcase>
<testcase classname="tests.test_report" name="test_other" time="0.1"/>
</testsuite></testsuites>"""


def test_run_and_skipped_come_from_the_xml(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(XML)
    line = ci_summary.summary(junit, "make peers failed, exit 2")
    assert line == ("CI checked: peer probes run (2) | skipped (1: no environment trl-0.11.4 (run `make peers`)) "
                    "[make peers failed, exit 2]; browser test run (0) | skipped (1: /usr/bin/chromium is absent)")


def test_no_xml_is_unknown_never_a_guess(tmp_path):
    assert "unknown" in ci_summary.summary(tmp_path / "missing.xml")
    junit = tmp_path / "junit.xml"
    junit.write_text('<testsuites><testsuite name="pytest"></testsuite></testsuites>')
    assert ci_summary.summary(junit) == "CI checked: peer probes not selected; browser test not selected"
