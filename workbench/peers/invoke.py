"""The host side of the JSON exchange: run one adapter inside one peer environment as a subprocess.

``run(env, adapter, args)`` locates the environment (``envs.locate``; ``"host"`` is the project's own
interpreter, which carries TRL 1.16), runs ``<python> -m workbench.peers.adapters.<adapter> '<json>'``
with this repository (and the environment's stand-ins) on ``PYTHONPATH``, offline, without CUDA, and
parses the marked JSON line the adapter prints last. It never raises for a peer problem: a missing
environment, a failed import, a crash or a timeout comes back as ``status`` "skipped" or "error" with
the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from workbench.core.paths import REPO_ROOT
from workbench.peers import envs
from workbench.peers.protocol import MARKER

HOST = "host"


def python_for(env: str, root=None) -> tuple[str | None, str, list[str]]:
    """(python, reason when missing, stand-in names) for an environment name or ``"host"``."""
    if env == HOST:
        return sys.executable, "", []
    try:
        spec = envs.get_spec(env)
    except ValueError as exc:
        return None, str(exc), []
    status = envs.locate(spec, root)
    return status.python, status.reason, list(spec.standins)


def subprocess_env(standins: list[str]) -> dict:
    paths = [str(REPO_ROOT)] + ([str(envs.STANDINS)] if standins else [])
    keep = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**keep, "PYTHONPATH": os.pathsep.join(paths), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), "RAY_DISABLE_IMPORT_WARNING": "1",
            "PYTHONWARNINGS": "ignore"}


def parse_output(stdout: str) -> dict | None:
    """The last marked JSON line of an adapter's stdout, or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            try:
                return json.loads(line[len(MARKER):])
            except ValueError:
                return None
    return None


def run(env: str, adapter: str, args: dict | None = None, timeout: float = 600, root=None) -> dict:
    """Run ``workbench.peers.adapters.<adapter>`` in ``env``; always returns a payload dict."""
    python, reason, standins = python_for(env, root)
    base = {"env": env, "adapter": adapter, "rows": [], "seconds": 0.0}
    if python is None:
        return {**base, "status": "skipped", "reason": reason}
    start = time.time()
    cmd = [python, "-m", f"workbench.peers.adapters.{adapter}", json.dumps(args or {})]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=subprocess_env(standins),
                              cwd=str(REPO_ROOT))
    except subprocess.TimeoutExpired:
        return {**base, "status": "error", "reason": f"timed out after {timeout:.0f} s", "seconds": time.time() - start}
    except OSError as exc:
        return {**base, "status": "skipped", "reason": f"cannot start {python}: {exc}"}
    payload = parse_output(proc.stdout)
    seconds = time.time() - start
    if payload is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        status = "skipped" if "ModuleNotFoundError" in (proc.stderr or "") else "error"
        return {**base, "status": status, "reason": f"exit code {proc.returncode}, no JSON result: {' | '.join(tail)[-600:]}",
                "seconds": seconds}
    return {**base, **payload, "seconds": seconds}
