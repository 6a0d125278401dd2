"""Experiment trackers: one path from a ``--report-to`` list to TensorBoard, trackio and Weights & Biases.

``open_trackers(["trackio", "wandb"], ...)`` returns a ``Trackers`` whose ``log(scalars, step)`` sends the same numbers
to every tracker named, and ``close()`` finishes each run. ``train --report-to`` logs every step's history and the
watch's counters through it, and ``watch --report-to`` logs the watch report's counters, so every scalar the workbench
reports reaches the trackers the same way.

Where each tracker writes:

- ``tensorboard``: event files in ``OUTPUT_DIR/tensorboard`` (an output folder is required);
- ``trackio``: trackio's local store, a SQLite file per project in ``$TRACKIO_DIR`` (trackio's default:
  ``~/.cache/huggingface/trackio``), shown by ``trackio show``;
- ``wandb``: a W&B run in offline mode unless ``WANDB_MODE`` says otherwise (``WANDB_MODE=online`` uploads as it
  runs, ``wandb sync`` uploads an offline run later), in ``OUTPUT_DIR/wandb`` or ``$WANDB_DIR``.

trackio and wandb are the ``trackers`` extra; a missing package is an ``InputError`` naming the extra to install.
Values that are not finite numbers are dropped from a step, never logged as NaN.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from workbench.core.errors import InputError

TRACKERS = ("tensorboard", "trackio", "wandb")
EXTRA = "rlhf-pitfalls-workbench[trackers]"  # the optional extra of pyproject.toml holding trackio and wandb
PROJECT = "rlhf-pitfalls-workbench"  # the trackio / W&B project unless TRACKIO_PROJECT / WANDB_PROJECT name another


# ---- choosing trackers ----

def tracker_names(values: list[str] | tuple[str, ...] | str | None) -> list[str]:
    """The trackers of a ``--report-to`` value: names separated by spaces or commas, ``none`` for none, duplicates
    once; an unknown name is an ``InputError`` listing the known ones."""
    if values is None:
        return []
    words = [values] if isinstance(values, str) else list(values)
    names: list[str] = []
    for word in words:
        for name in word.replace(",", " ").split():
            if name == "none":
                continue
            if name not in TRACKERS:
                raise InputError(f"--report-to {name!r}: unknown tracker; choose from {', '.join(TRACKERS)} (several "
                                 "at once: --report-to trackio wandb), or none")
            if name not in names:
                names.append(name)
    return names


def finite_scalars(values: dict) -> dict[str, float]:
    """The plottable numbers of a metrics dict: ints and floats (booleans and strings aside), finite only."""
    out = {}
    for key, value in values.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = float(value)
    return out


# ---- trackers ----

def _missing(name: str, exc: ImportError) -> InputError:
    fix = ("pip install tensorboard (a dependency of the workbench: pip install -e . from a checkout)" if name == "tensorboard"
           else f"install the trackers extra: pip install '{EXTRA}' (from a checkout: pip install -e '.[trackers]')")
    return InputError(f"--report-to {name} needs the {name} package, which is not installed ({exc}); {fix}")


class _TensorBoard:
    def __init__(self, output_dir: str | None):
        if not output_dir:
            raise InputError("--report-to tensorboard writes into --output-dir/tensorboard: give --output-dir DIR")
        from torch.utils.tensorboard import SummaryWriter
        self.where = str(Path(output_dir) / "tensorboard")
        self.writer = SummaryWriter(log_dir=self.where)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Trackio:
    def __init__(self, project: str, run_name: str, config: dict | None):
        import trackio  # check_installed has said what to install when missing
        from trackio.sqlite_storage import SQLiteStorage

        self.trackio = trackio
        self.run = trackio.init(project=project, name=run_name, config=config, embed=False, auto_log_cpu=False,
                                auto_log_gpu=False)
        self.where = f"trackio project {project!r}, run {self.run.name!r} in {SQLiteStorage.get_project_db_path(project)}"

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class _WandB:
    def __init__(self, project: str, run_name: str, config: dict | None, output_dir: str | None):
        import wandb
        mode = os.environ.get("WANDB_MODE", "offline")
        folder = output_dir or os.environ.get("WANDB_DIR")
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=run_name, config=config, mode=mode, dir=folder)
        self.where = f"W&B run {self.run.name!r} ({mode}) in {self.run.dir}"

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """Open trackers: ``log`` sends one step's scalars to each, ``close`` finishes them (also usable as ``with``)."""

    def __init__(self, trackers: list):
        self.trackers = trackers

    @property
    def where(self) -> list[str]:
        """Where each tracker writes, one line each (printed by the command line)."""
        return [tracker.where for tracker in self.trackers]

    def log(self, values: dict, step: int) -> None:
        scalars = finite_scalars(values)
        if scalars:
            for tracker in self.trackers:
                tracker.log(scalars, step)

    def close(self) -> None:
        while self.trackers:
            self.trackers.pop().close()

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_installed(names) -> list[str]:
    """The trackers of ``names`` (see ``tracker_names``), after checking that each one's package imports: an
    ``InputError`` naming the extra to install otherwise, before anything runs or is written."""
    names = tracker_names(names)
    for name in names:
        package = "torch.utils.tensorboard" if name == "tensorboard" else name
        try:
            __import__(package)
        except ImportError as exc:
            raise _missing(name, exc) from exc
    return names


def open_trackers(names, *, output_dir: str | None = None, run_name: str = "workbench", config: dict | None = None,
                  project: str | None = None) -> Trackers:
    """Start a run in each tracker of ``names`` (see ``tracker_names``); every package is imported before any run
    starts, so a missing one fails before anything is written."""
    names = check_installed(names)
    opened = []
    try:
        for name in names:
            if name == "tensorboard":
                opened.append(_TensorBoard(output_dir))
            elif name == "trackio":
                opened.append(_Trackio(project or os.environ.get("TRACKIO_PROJECT", PROJECT), run_name, config))
            else:
                opened.append(_WandB(project or os.environ.get("WANDB_PROJECT", PROJECT), run_name, config, output_dir))
    except BaseException:
        Trackers(opened).close()
        raise
    return Trackers(opened)
