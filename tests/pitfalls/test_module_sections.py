"""Every pitfall module has one shape: its top-level definitions stand under section banners in the documented order.

The order is the one ``workbench/pitfalls/__init__.py`` and docs/ARCHITECTURE.md give: measurements, sweeps, verdict,
figures, printers, explorer, metrics. A banner is a line ``# ---- <section> ----…``; a module uses the sections it
needs, each once, in that order. Constants and imports may stand above the first banner; every ``def`` and
``class`` stands under one, and the definitions whose kind their name or signature says (a ``verdict``, an ``ax``
function, an explorer, ``metrics``) stand in their own section.
"""

import ast
import re
from pathlib import Path

import pytest

from workbench.core.paths import REPO_ROOT

PITFALLS = REPO_ROOT / "workbench" / "pitfalls"
SECTIONS = ("measurements", "sweeps", "verdict", "figures", "printers", "explorer", "metrics")
BANNER = re.compile(r"^# -{2,} ?(?P<name>[^-].*?) ?-*$")
MODULES = sorted(PITFALLS.glob("nb*.py"))
# Notebook 90's figures, explorer and metrics live with the peer lab (``workbench.peers.expectations``): the
# peers layer runs other libraries' trainers, and pitfall modules may not import it.
NOTEBOOKS_WITHOUT_A_PITFALL_MODULE = {"90_peer_lab"}


def sections_of(path: Path) -> tuple[list[tuple[int, str]], list[tuple[ast.stmt, str | None]]]:
    """The banners ``[(line, section name)]`` and each top-level statement with the section it stands in (None above
    the first banner), from one read and one parse of the file."""
    source = path.read_text()
    banners = [(number, match["name"].strip()) for number, line in enumerate(source.splitlines(), 1)
               if (match := BANNER.match(line))]
    placed = []
    for node in ast.parse(source).body:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        above = [name for line, name in banners if line < start]
        placed.append((node, above[-1] if above else None))
    return banners, placed


def expected_section(node: ast.stmt) -> str | None:
    """The section a definition belongs to by its name or signature, or None where the module may choose."""
    if isinstance(node, ast.ClassDef):
        bases = {getattr(base, "id", getattr(base, "attr", None)) for base in node.bases}
        return "explorer" if "Explorer" in bases else None
    if isinstance(node, ast.Assign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return "verdict" if any(getattr(t, "id", None) == "PREDICTION" for t in targets) else None
    if not isinstance(node, ast.FunctionDef):
        return None
    name = node.name.lstrip("_")
    arguments = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
    if name in ("verdict", "not_shown") or name.startswith("verdict_"):
        return "verdict"
    if name == "metrics" or name.endswith("_metrics"):
        return "metrics"
    if name.endswith("_explorer"):
        return "explorer"
    if name.startswith(("plot_", "figure_")) or (arguments[:1] and arguments[0] in ("ax", "axes")):
        return "figures"
    if name.endswith(("_line", "_lines", "_sentence", "_note")):
        return "printers"
    return None


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_banners_name_the_documented_sections_in_order(path):
    banners, _ = sections_of(path)
    names = [name for _, name in banners]
    unknown = [(line, name) for line, name in banners if name not in SECTIONS]
    assert not unknown, f"{path.name}: banners {unknown} are not sections; use one of {SECTIONS}"
    assert len(names) == len(set(names)), f"{path.name}: a section appears twice: {names}"
    assert names == sorted(names, key=SECTIONS.index), f"{path.name}: sections {names} are not in the order {SECTIONS}"


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_every_definition_stands_in_its_section(path):
    _, placed = sections_of(path)
    misplaced = []
    for node, section in placed:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and section is None:
            misplaced.append(f"line {node.lineno}: {node.name} stands above the first banner")
        wanted = expected_section(node)
        if wanted is not None and section != wanted:
            name = getattr(node, "name", "PREDICTION")
            misplaced.append(f"line {node.lineno}: {name} belongs under '# ---- {wanted}', not {section!r}")
    assert not misplaced, f"{path.name}:\n" + "\n".join(misplaced)


def test_every_notebook_has_its_module():
    """``notebooks/NN_stem.ipynb`` is explained by ``workbench/pitfalls/nbNN_stem.py``, notebook 00 included."""
    stems = sorted(p.stem for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    missing = [s for s in stems if s not in NOTEBOOKS_WITHOUT_A_PITFALL_MODULE and not (PITFALLS / f"nb{s}.py").exists()]
    assert not missing, f"no module workbench/pitfalls/nb<stem>.py for the notebooks {missing}"


def test_the_section_rules_catch_a_misplaced_definition(tmp_path):
    module = tmp_path / "nb99_example.py"
    module.write_text("X = 1\n\n# ---- verdict ----\ndef verdict(x):\n    return x\n\n"
                      "# ---- measurements ----\ndef gap_line(x):\n    return f'{x}'\n\n"
                      "def metrics():\n    return {}\n")
    banners, placed = sections_of(module)
    assert [name for _, name in banners] == ["verdict", "measurements"]
    (printer, printer_section), (metrics, metrics_section) = placed[-2:]
    assert expected_section(printer) == "printers" and printer_section == "measurements"
    assert expected_section(metrics) == "metrics" and metrics_section == "measurements"
    with pytest.raises(AssertionError, match="not in the order"):
        test_banners_name_the_documented_sections_in_order(module)
    with pytest.raises(AssertionError, match="gap_line belongs under '# ---- printers'"):
        test_every_definition_stands_in_its_section(module)
    with pytest.raises(AssertionError, match="metrics belongs under"):
        test_every_definition_stands_in_its_section(module)
