"""Every dotted ``workbench.…`` name that the README, docs/ and the notebooks' markdown cells mention exists.

A renamed or moved function leaves its old name in prose that no test runs (a README or a notebook's first cell
naming a loader that was merged into another). Names are resolved by importing the longest importable module prefix
and following attributes from there. The journal (docs/journal/) is a dated record and not read.
"""

import importlib
import json
import re

from workbench.core.paths import REPO_ROOT

NAME = re.compile(r"(?<![\w./-])workbench(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def _texts():
    for path in [REPO_ROOT / "README.md", REPO_ROOT / "CONTRIBUTING.md", REPO_ROOT / "benchmarks" / "RESULTS.md",
                 *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        yield path, path.read_text()
    for path in sorted((REPO_ROOT / "notebooks").rglob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        yield path, "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")


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


def test_every_workbench_name_in_the_prose_exists():
    missing = {}
    for path, text in _texts():
        for match in NAME.finditer(text):
            if not resolves(match.group(0)):
                missing.setdefault(match.group(0), set()).add(str(path.relative_to(REPO_ROOT)))
    assert not missing, "names in the prose that do not exist (rename them): " + "; ".join(
        f"{name} in {', '.join(sorted(paths))}" for name, paths in sorted(missing.items()))
