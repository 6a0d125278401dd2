"""What a catalogue notebook calls to set itself up and to record its results.

* ``prepare(stem, out_dir, interactive=…)``: resolves the output folder (``runs/interactive/<stem>`` of the working
  folder when the notebook is opened by hand, the runner's folder in batch), applies the plot style, shows progress bars
  only when ``interactive``;
* ``save_figure(fig, out_dir, name)``: PNG next to the executed notebook, and what ``viz.legibility`` measured of it
  at notebook width in ``figures.json`` (the catalogue test reads it);
* ``write_metrics(...)``: the ``metrics.json`` contract, written atomically;
* ``cannot_show(reason, metrics)``: a pitfall this checkpoint cannot show, said and recorded.

``metrics.json``: ``{"notebook", "parameters", "reproduced", "fixed", "metrics"}`` where
``reproduced`` is true when the bug's signature was measured with the bug switched on and
``fixed`` true when it vanished with the fix.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from workbench.core import progress
from workbench.core.errors import NotebookStopped
from workbench.core.jsonsafe import jsonable
from workbench.experiments import statistics
from workbench.trainers.checkpointing import atomic_write_json
from workbench.viz import legibility, plots


def prepare(stem: str, out_dir: str = "", interactive: bool = True) -> Path:
    """The folder this notebook writes into (created), with the workbench plot style applied and progress bars shown
    when ``interactive`` (a batch run passes False: its outputs are a record, the runner's bar speaks for it)."""
    plots.apply_style()
    progress.show_bars(interactive)
    folder = Path(out_dir).absolute() if out_dir else working_folder() / "runs" / "interactive" / stem
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def working_folder(cwd: Path | None = None) -> Path:
    """Where a notebook opened by hand keeps its outputs: the folder it runs in, or that folder's parent when it runs
    in a ``notebooks/`` folder (the repository or a copy of it), never the installed package's."""
    cwd = Path.cwd() if cwd is None else cwd
    return cwd.parent if cwd.name == "notebooks" else cwd


def shown_path(path: str | Path) -> str:
    """``path`` as a notebook prints it: relative to the folder the notebook runs in (an executed notebook names no
    folder of the machine it ran on)."""
    return os.path.relpath(Path(path).absolute(), Path.cwd())


def save_figure(fig, out_dir: str | Path, name: str) -> Path:
    """Save ``fig`` as ``<name>.png`` and record ``viz.legibility.check_figure``'s findings in ``figures.json``."""
    path = Path(out_dir) / f"{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    record = Path(out_dir) / "figures.json"
    checks = json.loads(record.read_text()) if record.is_file() else {}
    checks[name] = legibility.check_figure(fig, name).as_dict()
    atomic_write_json(record, checks)
    return path


def write_metrics(
    out_dir: str | Path,
    *,
    notebook: str,
    reproduced: bool,
    fixed: bool,
    metrics: dict,
    headline: dict | None = None,
    parameters: dict | None = None,
    not_shown: str | list[str] | None = None,
) -> None:
    """Write ``metrics.json`` atomically and print a one-line verdict.

    ``parameters`` is filled in by the runner, which knows what it injected (the notebook's
    defaults overridden by smoke values and the user's ``-p``); a notebook need not pass it.

    ``headline`` is the one number a reader should remember, measured with the bug and with the
    fix: ``{"what": str, "unit": str, "bug": float, "fix": float}`` (the report leads with it).

    ``not_shown``: why this checkpoint cannot show (part of) the pitfall (``cannot_show``), recorded
    as ``metrics["not_shown"]``; ``None`` or empty when everything was measured.
    """
    reasons = [not_shown] if isinstance(not_shown, str) else [r for r in (not_shown or []) if r]
    if reasons:
        metrics = {**metrics, "not_shown": [*metrics.get("not_shown", []), *(cannot_show(r) for r in reasons)]}
    if headline is not None:
        missing = {"what", "unit", "bug", "fix"} - set(headline)
        if missing:
            raise ValueError(f"headline needs the keys what, unit, bug, fix; missing {sorted(missing)}")
        headline = {"what": str(headline["what"]), "unit": str(headline["unit"]),
                    "bug": float(headline["bug"]), "fix": float(headline["fix"])}
    payload = jsonable(
        {"notebook": notebook, "parameters": parameters, "reproduced": bool(reproduced), "fixed": bool(fixed),
         "metrics": metrics, **({"headline": headline} if headline is not None else {})}
    )
    path = Path(out_dir) / "metrics.json"
    atomic_write_json(path, payload)
    print(closing_line(payload, shown_path(path)))


def closing_line(payload: dict, where: str) -> str:
    """The notebook's last line: the mechanism (reproduced with the bug, gone with the fix) apart from its consequence
    in training (the prediction's verdict, chosen by its numbers; "not measured here" when the notebook trains nothing)."""
    yes = {True: "yes", False: "no"}
    mechanism = f"mechanism reproduced: {yes[payload['reproduced']]}, fixed: {yes[payload['fixed']]}"
    record = payload["metrics"].get("prediction")
    if isinstance(record, dict) and "direction" in record:
        kind, text = statistics.prediction_verdict(record)
        consequence = {"as predicted": "shown, as predicted", "opposite": "shown, opposite to the prediction"}.get(
            kind, f"not shown: {text}")
    else:
        consequence = "not measured here"
    return f"{payload['notebook']}: {mechanism}; consequence in training: {consequence} → {where}"


def cannot_show(reason: str, metrics: dict | None = None) -> str:
    """Say that this checkpoint cannot show (part of) the pitfall, and why: printed for the reader and
    recorded as ``metrics["not_shown"]`` (a list, one reason per part) for ``metrics.json``, so that a
    verdict is never claimed for something that was not measured. Returns the reason."""
    print(f"cannot show with this checkpoint: {reason}")
    if metrics is not None:
        metrics.setdefault("not_shown", []).append(reason)
    return reason


def stop_here(out_dir: str | Path, *, notebook: str, reason: str, metrics: dict | None = None) -> None:
    """End the notebook early because this checkpoint cannot show the pitfall at all: print the
    reason, write ``metrics.json`` with ``reproduced``/``fixed`` false, ``metrics["not_shown"]`` and
    ``metrics["stopped"]``, then raise ``NotebookStopped`` (the runner reports "cannot show", not a
    failure; opened by hand, the remaining cells are not meant to run)."""
    write_metrics(out_dir, notebook=notebook, reproduced=False, fixed=False,
                  metrics={**(metrics or {}), "stopped": reason}, not_shown=reason)
    raise NotebookStopped(f"{notebook}: {reason}")


def read_metrics(out_dir: str | Path) -> dict | None:
    path = Path(out_dir) / "metrics.json"
    return json.loads(path.read_text()) if path.is_file() else None
