"""Test modules have unique file names: tests/ has no packages (no __init__.py), so pytest imports each test file by its
base name, and two files of one name in different folders stop the whole collection ("import file mismatch")."""

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_name_is_unique():
    folders = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        folders[path.name].append(str(path.parent.relative_to(TESTS)))
    clashes = {name: where for name, where in folders.items() if len(where) > 1}
    assert not clashes, f"rename one of each: {clashes}"
