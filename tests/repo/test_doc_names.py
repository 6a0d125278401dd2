"""Every dotted ``workbench.…`` name that the README, docs/, the notebooks' markdown cells and the docstrings and
comments of workbench/ mention exists.

A renamed or moved function leaves its old name in prose that no test runs (a README or a notebook's first cell
naming a loader that was merged into another, a docstring pointing at a function that moved). Names are resolved by
importing the longest importable module prefix and following attributes from there. A name followed by a
placeholder (``workbench.pitfalls.nbNN_*``, ``…<stem>``) is a pattern, not a name, and the keys of the exercise
notebooks' ``workbench`` metadata (``workbench.exercise``) are not Python names. The journal (docs/journal/) is a
dated record and not read.
"""

import ast
import importlib
import io
import json
import re
import tokenize
from pathlib import Path

from helpers import REFERENCE_PAGES

from workbench.core.paths import REPO_ROOT

NAME = re.compile(r"(?<![\w./-])workbench(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
PLACEHOLDER = ("*", "<", "{")  # a character right after a name that makes it a pattern


def _texts():
    for path in REFERENCE_PAGES:
        yield path, path.read_text()
    for path in sorted((REPO_ROOT / "notebooks").rglob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        yield path, "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")


def code_prose(source: str) -> list[str]:
    """The docstrings (module, class, function) and the comments of a Python source."""
    texts = [doc for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
             and (doc := ast.get_docstring(node, clean=False))]
    return texts + [token.string for token in tokenize.generate_tokens(io.StringIO(source).readline)
                    if token.type == tokenize.COMMENT]


def _code_texts():
    for path in sorted((REPO_ROOT / "workbench").rglob("*.py")):
        yield path, "\n".join(code_prose(path.read_text()))


def metadata_keys() -> set[str]:
    """``workbench.<key>`` for every key of the exercise notebooks' ``workbench`` metadata."""
    return {f"workbench.{key}" for path in sorted((REPO_ROOT / "notebooks").rglob("*.ipynb"))
            for key in json.loads(path.read_text()).get("metadata", {}).get("workbench", {})}


def names(text: str) -> list[str]:
    """The dotted ``workbench.…`` names in ``text``, placeholders' patterns left out."""
    return [match.group(0) for match in NAME.finditer(text) if text[match.end():match.end() + 1] not in PLACEHOLDER]


def resolves(name: str) -> bool:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        try:
            obj = importlib.import_module(prefix)
        except ModuleNotFoundError as error:
            if error.name != prefix:  # the module exists but a dependency of it is missing: that is not a wrong name
                raise
            continue
        for attribute in parts[end:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def test_the_resolver_tells_a_missing_name():
    assert resolves("workbench.modeling.models.load_checkpoint") and resolves("workbench.load")
    assert not resolves("workbench.modeling.models.load") and not resolves("workbench.no_such_module")


def test_the_code_scan_reads_docstrings_and_comments_only():
    source = ('"""Uses workbench.core.losses.aggregate_loss."""\n'
              'def f():\n    """Calls workbench.no_such_function; see workbench.pitfalls.nbNN_*."""\n'
              '    return "workbench.a_string_literal"  # workbench.a_comment\n')
    found = [name for text in code_prose(source) for name in names(text)]
    assert sorted(found) == ["workbench.a_comment", "workbench.core.losses.aggregate_loss", "workbench.no_such_function"]
    assert "workbench.exercise" in metadata_keys()


def _missing(texts) -> dict[str, set[str]]:
    known, missing = metadata_keys(), {}
    for path, text in texts:
        for name in names(text):
            if name not in known and not resolves(name):
                missing.setdefault(name, set()).add(str(Path(path).relative_to(REPO_ROOT)))
    return missing


def _report(missing: dict[str, set[str]]) -> str:
    return "; ".join(f"{name} in {', '.join(sorted(paths))}" for name, paths in sorted(missing.items()))


def test_every_workbench_name_in_the_prose_exists():
    missing = _missing(_texts())
    assert not missing, "names in the prose that do not exist (rename them): " + _report(missing)


def test_every_workbench_name_in_docstrings_and_comments_exists():
    missing = _missing(_code_texts())
    assert not missing, "names in workbench/'s docstrings and comments that do not exist (rename them): " + _report(missing)
