"""``load_callable("MODULE:FUNCTION")``: the user's function for the CLI and the notebook.

``MODULE`` is a dotted module importable from the current directory (``mypkg.losses``) or a path to
a ``.py`` file (``examples/buggy_trainers.py``); a file's folder goes first on ``sys.path``, so the file
imports its sibling modules as it does when run as a script, from whatever folder the command runs in.
Failures raise ``AuditInputError`` naming what was
not found and how to spell it. Standard library only.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from workbench.core.errors import AuditInputError


def load_module(module: str):
    """Import a dotted module (from the current directory too) or a ``.py`` file by path."""
    path = Path(module)
    if module.endswith(".py") or path.is_file():
        if not path.is_file():
            raise AuditInputError(f"no such file {module!r}: give a path to a .py file or a dotted module name")
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)  # as `python file.py` does: its sibling modules import
        name = path.stem
        if not name.isidentifier() or name in sys.modules:
            name = f"_audit_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception as exc:
            del sys.modules[name]
            raise AuditInputError(f"importing {module} failed: {type(exc).__name__}: {exc}") from exc
        return mod
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise AuditInputError(
            f"cannot import module {module!r} ({exc}); run from the folder that holds it or pass a .py path"
        ) from exc


def load_callable(spec: str):
    """The callable named by ``MODULE:FUNCTION`` (``FUNCTION`` may be dotted: ``Class.method``)."""
    if spec.count(":") != 1 or not all(spec.split(":")):
        raise AuditInputError(f"{spec!r} is not MODULE:FUNCTION (e.g. examples/buggy_trainers.py:grpo_loss or mypkg.losses:loss)")
    module, function = spec.split(":")
    obj = load_module(module)
    for part in function.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n)))
            raise AuditInputError(f"{module} has no attribute {function!r}; callables there: {', '.join(names) or 'none'}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise AuditInputError(f"{spec} is a {type(obj).__name__}, not a function")
    return obj
