"""Commit subjects stay readable in `git log --oneline`: at most 72 characters (CONTRIBUTING.md, "Commits").

The rule holds from the commit that introduced it on; older subjects are history and stay as they are. Skipped where
the checkout has no git history that reaches that commit (a tarball, a shallow clone).
"""

import shutil
import subprocess

import pytest

from workbench.core.paths import REPO_ROOT

RULE_SINCE = "6bae5e1"  # the last commit before the rule; its descendants follow it
LIMIT = 72


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)


def long_subjects(subjects: list[str], limit: int = LIMIT) -> list[str]:
    return [subject for subject in subjects if len(subject) > limit]


def test_long_subjects_are_found():
    assert long_subjects(["Add the vLLM sampler", "x" * 73]) == ["x" * 73]
    assert long_subjects(["x" * 72]) == []


def test_every_subject_since_the_rule_fits():
    if shutil.which("git") is None or git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout")
    if git("cat-file", "-e", f"{RULE_SINCE}^{{commit}}").returncode != 0:
        pytest.skip(f"the history does not reach {RULE_SINCE} (a shallow clone)")
    log = git("log", "--format=%s", f"{RULE_SINCE}..HEAD")
    assert log.returncode == 0, log.stderr
    too_long = long_subjects(log.stdout.splitlines())
    assert not too_long, f"commit subjects over {LIMIT} characters (reword them: git rebase -i): {too_long}"
