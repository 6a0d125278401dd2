"""The import rules of the package layout: ``lint-imports`` keeps every contract in pyproject.toml.

The contracts: the layers (cli > catalogue > pitfalls | peers > experiments > trainers > engines > modeling > tasks >
core,
so no cycles between them), core imports nothing else of the package, viz only core, audit only itself and core's
errors, trainers never viz or catalogue, and no pitfall module imports another.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(exe).exists():
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([exe, "--no-cache"], cwd=REPO, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert ", 0 broken." in result.stdout, result.stdout[-2000:]


def test_every_pitfall_module_is_named_in_the_package_docstring():
    """The pitfalls package's docstring is its table of contents: a module missing from it is a room a newcomer
    cannot find from the index."""
    import workbench.pitfalls

    names = sorted(p.stem for p in (REPO / "workbench" / "pitfalls").glob("nb*.py"))
    missing = [name for name in names if f"``{name}``" not in workbench.pitfalls.__doc__]
    assert not missing, f"workbench/pitfalls/__init__.py's docstring does not name {missing}: add a line for each"
