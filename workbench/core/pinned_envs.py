"""Pinned virtual environments beside the project's own: where they live, whether one is ready, how one is built.

The peer lab (``workbench.peers.envs``, one environment per released library) and the engine environment
(``workbench.engines.envs``, vLLM's CPU build) share the same life cycle, kept here once:

- they live outside any checkout, under ``$<VARIABLE>`` or ``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/workbench/<kind>``,
  so that a fresh clone (CI) reuses an environment whose stamp still matches (``cache_root``);
- ``stamp.json`` records the requested pins; an environment is ready when its interpreter exists and its stamp's pins
  equal the requested ones, else the status says why and which ``make`` target fixes it (``locate``);
- ``build`` recreates one from scratch: a venv from the base interpreter, a constraints file pinning torch, the
  caller's install steps; it never raises for an install failure: it removes the half-built environment, writes
  ``<env>.failed`` with the reason (``locate`` shows it) and returns a status that is not ready.

Imports only the standard library (CI's soft-failing steps and the engine's child process use it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

TORCH_PIN = "torch==2.13.0"  # the CPU wheel this project is tested with; pinned in every pip call, also as a constraint
STAMP = "stamp.json"


@dataclass
class EnvStatus:
    """Whether a pinned environment is ready: its interpreter, or the reason it cannot be used (with the fix)."""

    name: str
    ready: bool
    python: str | None
    reason: str = ""
    seconds: float = 0.0
    size_mb: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def cache_root(root: str | os.PathLike | None, variable: str, kind: str) -> Path:
    """``root`` if given, else ``$variable`` if set, else ``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/workbench/<kind>``."""
    if root or os.environ.get(variable):
        return Path(root or os.environ[variable])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "workbench" / kind


def read_stamp(path: Path) -> dict | None:
    try:
        return json.loads((path / STAMP).read_text())
    except (OSError, ValueError):
        return None


def failed_marker(path: Path) -> Path:
    """``<env>.failed``: the reason the last creation failed, shown while the environment is missing."""
    return path.with_name(path.name + ".failed")


def locate(path: Path, name: str, pins: dict, target: str, label: str = "environment") -> EnvStatus:
    """The status of the environment at ``path`` built for ``pins``: ready with its python, or why not and
    ``make <target>``. A ready status carries the stamp's recorded ``size_mb`` and ``seconds``."""
    python = path / "bin" / "python"
    if not python.exists():
        failed = failed_marker(path)
        why = failed.read_text().strip()[-600:] if failed.exists() else f"run `make {target}` to create it"
        return EnvStatus(name, False, None, f"{label} {path} does not exist ({why})")
    stamp = read_stamp(path)
    if stamp is None:
        return EnvStatus(name, False, None, f"{label} {path} has no {STAMP} (creation did not finish); run `make {target}`")
    if stamp.get("pins") != pins:
        return EnvStatus(name, False, None, f"{label} {path} was built for other pins; run `make {target}`")
    return EnvStatus(name, True, str(python), size_mb=float(stamp.get("size_mb", 0.0)), seconds=float(stamp.get("seconds", 0.0)))


def build(path: Path, name: str, pins: dict, install: Callable[[str, Path], dict], log: Callable[[str], None],
          tag: str) -> EnvStatus:
    """Recreate the environment at ``path``: a venv, ``constraints.txt`` holding ``TORCH_PIN``, then
    ``install(python, constraints)``, which runs the pip steps and returns what the stamp records besides the pins
    (``freeze``, versions, ``size_mb``…). Any failure of those steps (a failing or hanging pip call, a wrong torch:
    ``RuntimeError``) is a status that is not ready, its reason in ``<env>.failed``; never raises for it."""
    failed = failed_marker(path)
    start = time.time()
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", sys.executable)
    try:
        subprocess.run([base, "-m", "venv", str(path)], check=True, capture_output=True, text=True)
        python = str(path / "bin" / "python")
        constraints = path / "constraints.txt"
        constraints.write_text(TORCH_PIN + "\n")
        recorded = install(python, constraints)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, RuntimeError, OSError, StopIteration) as exc:
        detail = getattr(exc, "stderr", None) or str(exc) or type(exc).__name__
        reason = f"could not create {name}: {detail.strip()[-800:]}"
        shutil.rmtree(path, ignore_errors=True)  # a half-built environment is never used
        failed.write_text(reason + "\n")
        log(f"[{tag}] {reason}")
        return EnvStatus(name, False, None, reason, time.time() - start)
    seconds = time.time() - start
    stamp = {"pins": pins, **recorded, "seconds": round(seconds, 1), "created": time.strftime("%Y-%m-%d %H:%M:%S")}
    (path / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    if failed.exists():
        failed.unlink()
    return EnvStatus(name, True, python, "", seconds, float(recorded.get("size_mb", 0.0)))


def installed_torch(python: str) -> str:
    """The torch version an environment's interpreter imports; ``RuntimeError`` unless it is ``TORCH_PIN``'s."""
    version = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], check=True, capture_output=True,
                             text=True).stdout.strip()
    if not version.startswith(TORCH_PIN.split("==")[1]):
        raise RuntimeError(f"torch {version} was installed instead of {TORCH_PIN}")
    return version


def pip_freeze(python: str) -> list[str]:
    return subprocess.run([python, "-m", "pip", "freeze"], check=True, capture_output=True, text=True).stdout.splitlines()
