"""``call_site()``: the first frame outside the watch's machinery. The standard library's functools.py and
contextlib.py are skipped (their frames sit between a caller and what it wraps); a user's file named like them
(``my_functools.py``, or ``functools.py`` in the user's own folder) is the user's line."""

import functools
import importlib.util
from pathlib import Path

from workbench.watch.callsite import call_site


def call_from(filename: str) -> str:
    """``call_site()`` called by a frame whose code claims to come from ``filename``."""
    namespace = {"call_site": call_site}
    exec(compile("site = call_site()", filename, "exec"), namespace)  # the caller when that frame is skipped
    return namespace["site"]


def marked_line() -> int:
    return next(number for number, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                if text.endswith("# the caller when that frame is skipped"))


def test_the_standard_librarys_functools_and_contextlib_are_skipped():
    import contextlib

    for module in (functools, contextlib):
        assert call_from(module.__file__) == f"{__file__}:{marked_line()}"


def test_a_user_file_named_like_them_is_the_call_site(tmp_path):
    assert call_from(str(tmp_path / "functools.py")) == f"{tmp_path / 'functools.py'}:1"
    path = tmp_path / "my_functools.py"
    path.write_text("from workbench.watch.callsite import call_site\n\n\ndef where():\n    return call_site()\n")
    spec = importlib.util.spec_from_file_location("my_functools", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.where() == f"{path}:5"
