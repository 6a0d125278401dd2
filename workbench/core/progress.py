"""Progress bars for work that runs longer than a few seconds: training runs, sweeps, model builds.

A reader who runs a notebook cell by hand sees a bar with its steps and an ETA (tqdm's notebook bar in JupyterLab,
a text bar in a terminal); a batch run of the catalogue shows none, since its notebooks' outputs are a record and the
runner's own bar already speaks. ``catalogue.notebook_api.prepare(…, interactive=…)`` sets which for a notebook;
``WORKBENCH_PROGRESS=0`` in the environment switches them off for a script.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")

_shown = os.environ.get("WORKBENCH_PROGRESS", "1") != "0"


def show_bars(shown: bool) -> None:
    """Show (``True``) or hide the bars from now on in this process."""
    global _shown
    _shown = bool(shown)


def bars_shown() -> bool:
    return _shown


@contextlib.contextmanager
def hidden() -> Iterator[None]:
    """No bars inside the block (an explorer's redraw: its figure replaces the output, a bar would stay above it)."""
    global _shown
    shown, _shown = _shown, False
    try:
        yield
    finally:
        _shown = shown


def bar(total: int, desc: str, unit: str = "step") -> tqdm:
    """A bar of ``total`` units (hidden when bars are off): ``update(n)``, ``close()``; its line keeps the time taken."""
    return tqdm(total=total, desc=desc, unit=unit, disable=not _shown, leave=True, dynamic_ncols=True)


def track(items: Iterable[T], desc: str, unit: str = "run", total: int | None = None) -> Iterator[T]:
    """``items`` one by one, with a bar of ``total`` (default ``len(items)``) units while they are worked through."""
    items = list(items) if total is None and not hasattr(items, "__len__") else items
    with bar(total if total is not None else len(items), desc, unit) as progress:
        for item in items:
            yield item
            progress.update(1)


class StepFiles:
    """Steps done by runs in worker processes, for a bar in this one: run ``k`` writes its count to its own file
    (``report(path, n)``, replaced whole), this process sums the files (``done()``). Files, not a queue: a worker
    forked from a catalogue kernel shares nothing else with the notebook's process."""

    def __init__(self, runs: int):
        self.folder = tempfile.mkdtemp(prefix="workbench-progress-")
        self.paths = [os.path.join(self.folder, str(k)) for k in range(runs)]

    @staticmethod
    def report(path: str, steps: int) -> None:
        staged = f"{path}.new"
        with open(staged, "w") as handle:
            handle.write(str(steps))
        os.replace(staged, path)

    def done(self) -> int:
        total = 0
        for path in self.paths:
            try:
                with open(path) as handle:
                    total += int(handle.read())
            except (OSError, ValueError):  # not started yet
                pass
        return total

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
