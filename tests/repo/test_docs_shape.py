"""The docs a newcomer meets stay short and linked, and the code says what it is, not where it came from.

README.md: at most 150 lines, the two commands in its first 20, a catalogue row for every notebook. Reference pages
(README.md, CONTRIBUTING.md, docs/*.md, benchmarks/RESULTS.md): no prose line over 160 characters (table rows may
be longer), every relative link pointing at a file that exists. workbench/ and tests/: no reference to this
project's issue tracker (the history lives in git and docs/journal/).
"""

import re

import pytest
from helpers import REFERENCE_PAGES

from workbench.core.paths import REPO_ROOT

README = REPO_ROOT / "README.md"
LINK = re.compile(r"\]\((?P<target>[^)\s#]+)(?:#[^)]*)?\)")
ISSUE_REFERENCE = re.compile(r"\b[Ii]ssues? [0-9]+")


def long_prose_lines(text: str, limit: int = 160) -> list[int]:
    """Line numbers of lines over ``limit`` characters that are not table rows."""
    return [number for number, line in enumerate(text.splitlines(), 1)
            if len(line) > limit and not line.lstrip().startswith("|")]


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move detail to a page under docs/"
    head = "\n".join(lines[:20])
    assert "make run" in head and "make test" in head, "README.md's first 20 lines must show `make run` and `make test`"


def test_readme_catalogue_has_a_row_for_every_notebook():
    text = README.read_text()
    notebooks = sorted(p.name for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    missing = [name for name in notebooks if f"(notebooks/{name})" not in text]
    assert not missing, f"README.md's catalogue table has no row linking {missing}"


@pytest.mark.parametrize("page", REFERENCE_PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_reference_page_lines_fit(page):
    long = long_prose_lines(page.read_text())
    assert not long, f"{page.relative_to(REPO_ROOT)}: lines {long} are over 160 characters; wrap them"


@pytest.mark.parametrize("page", REFERENCE_PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_reference_page_links_resolve(page):
    broken = [m["target"] for m in LINK.finditer(page.read_text())
              if "://" not in m["target"] and not m["target"].startswith("mailto:")
              and not (page.parent / m["target"]).exists()]
    assert not broken, f"{page.relative_to(REPO_ROOT)} links to files that do not exist: {broken}"


def test_code_names_no_issue_of_this_project():
    hits = [f"{path.relative_to(REPO_ROOT)}:{number}"
            for folder in ("workbench", "tests") for path in sorted((REPO_ROOT / folder).rglob("*.py"))
            for number, line in enumerate(path.read_text().splitlines(), 1) if ISSUE_REFERENCE.search(line)]
    assert not hits, f"say what the code does, not which issue asked for it: {hits}"


def test_the_checks_fail_on_what_they_guard():
    assert long_prose_lines("x" * 161 + "\n| " + "y" * 200 + "\n" + "z" * 160) == [1]
    assert ISSUE_REFERENCE.search("a comment (iss" + "ue 29)") and not ISSUE_REFERENCE.search("TRL #3750")
