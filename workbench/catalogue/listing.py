"""Reading the notebook catalogue: each notebook's purpose and ``parameters`` cell.

A catalogue notebook follows three conventions, enforced by ``tests/test_notebooks.py``:

1. its first cell is markdown naming the pitfall;
2. its second cell is tagged ``parameters`` and holds only ``name = <literal>`` assignments
   (at least ``model``, ``seed``, ``smoke``, ``out_dir``);
3. its metadata ``workbench`` entry gives ``purpose`` (one line), ``smoke_parameters`` (the
   small/fast values ``--smoke`` passes) and optionally ``main_figure``.

The runner validates command-line parameters against the parameters cell, so a misspelt name
is an error listing the valid ones instead of papermill's silent warning.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from workbench.core.config_options import convert_value
from workbench.core.errors import ParameterError
from workbench.core.paths import REPO_ROOT

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
REQUIRED_PARAMETERS = ("model", "seed", "smoke", "out_dir")


@dataclass
class NotebookInfo:
    stem: str
    path: Path
    purpose: str
    parameters: dict
    smoke_parameters: dict = field(default_factory=dict)
    main_figure: str | None = None


def parameters_cell_source(notebook) -> str:
    for cell in notebook.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            return cell.source
    raise ParameterError("the notebook has no cell tagged 'parameters'")


def parse_parameters(source: str) -> dict:
    """``{name: value}`` from a parameters cell; anything but ``name = <literal>`` is an error."""
    parameters = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue  # a docstring-like comment string
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0], node.value
        else:
            raise ParameterError(f"line {node.lineno}: the parameters cell may only hold `name = <literal>` assignments")
        try:
            parameters[target.id] = ast.literal_eval(value)
        except ValueError:
            raise ParameterError(f"line {node.lineno}: {target.id} must be a literal (derived values go after the cell)") from None
    return parameters


def read_notebook_info(path: str | Path) -> NotebookInfo:
    path = Path(path)
    notebook = nbformat.read(str(path), as_version=4)
    meta = notebook.metadata.get("workbench", {})
    return NotebookInfo(
        stem=path.stem,
        path=path,
        purpose=meta.get("purpose", ""),
        parameters=parse_parameters(parameters_cell_source(notebook)),
        smoke_parameters=dict(meta.get("smoke_parameters", {})),
        main_figure=meta.get("main_figure"),
    )


def catalogue(notebooks_dir: str | Path = NOTEBOOKS_DIR) -> list[NotebookInfo]:
    """Every notebook of the catalogue, in file-name order."""
    return [read_notebook_info(p) for p in sorted(Path(notebooks_dir).glob("[0-9][0-9]_*.ipynb"))]


def find_notebook(name: str, notebooks_dir: str | Path = NOTEBOOKS_DIR) -> NotebookInfo:
    """A notebook by stem (``01_position_ids``), unique prefix (``01``) or path."""
    path = Path(name)
    if path.suffix == ".ipynb" and path.is_file():
        return read_notebook_info(path)
    infos = catalogue(notebooks_dir)
    exact = [i for i in infos if i.stem == name]
    matches = exact or [i for i in infos if i.stem.startswith(name)]
    if len(matches) != 1:
        stems = ", ".join(i.stem for i in infos)
        problem = "matches several notebooks" if matches else "is not a notebook of the catalogue"
        raise ParameterError(f"{name!r} {problem}; choose one of: {stems}")
    return matches[0]


def resolve_parameters(info: NotebookInfo, overrides: dict, smoke: bool = False) -> dict:
    """The parameters to inject: smoke values (if ``smoke``), then the user's overrides.

    ``overrides`` values may be strings (from the command line, converted to the default's
    type) or Python values (checked against the default's type).
    """
    unknown = sorted(set(overrides) - set(info.parameters))
    if unknown:
        raise ParameterError(
            f"{info.stem} has no parameter {', '.join(map(repr, unknown))}; valid names: {', '.join(info.parameters)}"
        )
    resolved = {}
    if "interactive" in info.parameters:
        resolved["interactive"] = False  # batch runs never wait for a widget
    if smoke:
        resolved.update(info.smoke_parameters)
        resolved["smoke"] = True
    for name, value in overrides.items():
        default = info.parameters[name]
        if isinstance(value, str) and not isinstance(default, str):
            value = convert_value(name, value, default)
        elif default is not None and not isinstance(value, type(default)) and not (
            isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool)
        ):
            raise ParameterError(f"parameter {name!r} expects a {type(default).__name__}; got {value!r}")
        resolved[name] = value
    return resolved
