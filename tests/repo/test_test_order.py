"""The suite's heaviest files run first (``tests/conftest.py``'s ``RUN_FIRST``): every file named there exists, so a
renamed file does not silently fall back to the end of the queue."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run_first() -> tuple[str, ...]:
    """``RUN_FIRST`` of tests/conftest.py, read from that file (``import conftest`` may find another folder's)."""
    spec = importlib.util.spec_from_file_location("root_conftest", REPO / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.RUN_FIRST


RUN_FIRST = _run_first()


def test_every_file_run_first_exists_once():
    assert len(set(RUN_FIRST)) == len(RUN_FIRST)
    missing = [path for path in RUN_FIRST if not (REPO / path).is_file()]
    assert not missing, f"tests/conftest.py RUN_FIRST names files that do not exist: {missing}; update the list"


def test_collection_puts_them_first(request):
    order = list(dict.fromkeys(item.path.relative_to(REPO).as_posix() for item in request.session.items))
    present = [path for path in RUN_FIRST if path in order]
    assert order[: len(present)] == present
