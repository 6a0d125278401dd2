"""The suite's heaviest files run first (``tests/conftest.py``'s ``RUN_FIRST``): every file named there exists, so a
renamed file does not silently fall back to the end of the queue."""

from pathlib import Path

from conftest import RUN_FIRST

REPO = Path(__file__).resolve().parents[2]


def test_every_file_run_first_exists_once():
    assert len(set(RUN_FIRST)) == len(RUN_FIRST)
    missing = [path for path in RUN_FIRST if not (REPO / path).is_file()]
    assert not missing, f"tests/conftest.py RUN_FIRST names files that do not exist: {missing}; update the list"


def test_collection_puts_them_first(request):
    order = list(dict.fromkeys(item.path.relative_to(REPO).as_posix() for item in request.session.items))
    present = [path for path in RUN_FIRST if path in order]
    assert order[: len(present)] == present
