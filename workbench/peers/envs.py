"""One pinned virtual environment per peer release (``~/.cache/workbench/peers/<peer>-<version>/``).

The peers pin conflicting versions (verl wants transformers < 5.11, OpenRLHF == 5.15, TRL 0.11 a 4.x
release), so each release gets its own environment, created on first use or by ``make peers``. Every
environment pins ``torch==2.13.0`` (the CPU wheel on disk; an unpinned torch would pull a multi-GB CUDA
build) in every pip call, also as a constraint. A peer whose declared dependencies pull GPU-only packages
(deepspeed's CUDA ops, vLLM, flash-attn) is installed with ``--no-deps`` beside an explicit, minimal list
of what its probed modules import. Imports that need flash-attn are satisfied by the stand-in package in
``workbench/peers/standins`` (put on ``PYTHONPATH`` for that environment only, reported by every probe).

Creation is idempotent: ``stamp.json`` inside the environment records the exact requested pins and
``pip freeze``; an environment whose stamp matches its spec is reused, one whose stamp differs is
rebuilt. Creation fails soft: a failed install returns ``EnvStatus(ready=False, reason=...)`` and the
probes of that peer are reported as skipped with the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from workbench.core import pinned_envs
from workbench.core.pinned_envs import STAMP, TORCH_PIN, EnvStatus, read_stamp

__all__ = ["STAMP", "TORCH_PIN", "EnvStatus", "read_stamp"]  # the life cycle's names, kept importable from here
STANDINS = Path(__file__).resolve().parent / "standins"
PIP_TIMEOUT = 1200  # seconds for one pip call (a source build that hangs is a skip, not a stuck CI)


@dataclass(frozen=True)
class EnvSpec:
    """What one peer environment holds. ``requirements`` install with their dependencies (beside torch);
    ``no_deps`` install without them; ``no_build_isolation`` are source distributions built against the
    environment's own torch (so the build cannot fetch another torch)."""

    peer: str
    version: str
    requirements: tuple[str, ...]
    no_deps: tuple[str, ...] = ()
    no_build_isolation: tuple[str, ...] = ()
    standins: tuple[str, ...] = ()
    build_env: dict = field(default_factory=dict)
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.peer}-{self.version}"

    def pins(self) -> dict:
        """The stamp's request part: everything that, when changed, must rebuild the environment."""
        return {"python": f"{sys.version_info.major}.{sys.version_info.minor}", "torch": TORCH_PIN,
                "requirements": list(self.requirements), "no_deps": list(self.no_deps),
                "no_build_isolation": list(self.no_build_isolation), "standins": list(self.standins),
                "build_env": dict(self.build_env)}


SPECS: dict[str, EnvSpec] = {s.name: s for s in (
    EnvSpec("trl", "0.11.4", ("trl==0.11.4", "transformers==4.45.2", "accelerate==1.0.1", "datasets==3.0.1",
                              "tyro==0.8.14", "rich==13.9.2", "numpy==1.26.4", "pyarrow==17.0.0"),
            note="S3: PPOv2Trainer generates to the end unless stop_token is set"),
    EnvSpec("trl", "0.15.2", ("trl==0.15.2", "transformers==4.49.0", "accelerate==1.5.2", "datasets==3.4.1",
                              "rich==13.9.4", "numpy==2.2.6"),
            note="S5: GRPOTrainer per-sequence mean"),
    EnvSpec("trl", "0.16.1", ("trl==0.16.1", "transformers==4.49.0", "accelerate==1.5.2", "datasets==3.4.1",
                              "rich==13.9.4", "numpy==2.2.6"),
            note="S5: GRPOTrainer global token mean"),
    EnvSpec("transformers", "4.41.2", ("transformers==4.41.2", "numpy==1.26.4"), standins=("flash_attn",),
            note="S2: Qwen2 flash_attention_2 right-padding check present"),
    EnvSpec("transformers", "4.42.4", ("transformers==4.42.4", "numpy==1.26.4"), standins=("flash_attn",),
            note="S2: check removed for Qwen2"),
    EnvSpec("openrlhf", "0.11.2",
            ("transformers==5.15.0", "accelerate==1.15.0", "peft==0.18.1", "einops==0.8.1", "sympy==1.14.0",
             "pylatexenc==2.10", "tqdm==4.67.1", "hjson==3.1.0", "msgpack==1.1.1", "ninja==1.13.0", "psutil==7.1.3",
             "py-cpuinfo==9.0.0", "pydantic==2.12.5", "nvidia-ml-py==13.580.82", "numpy==2.3.5"),
            no_deps=("openrlhf==0.11.2",), no_build_isolation=("deepspeed==0.19.6",), standins=("flash_attn",),
            build_env={"DS_BUILD_OPS": "0", "DS_ACCELERATOR": "cpu"},
            note="S1/S4 fixed; its declared deps pull flash-attn, vLLM-era ray and deepspeed CUDA ops"),
    EnvSpec("verl", "0.9.1",
            ("transformers==5.10.4", "ray==2.55.0", "tensordict==0.10.0", "codetiming==1.4.0", "hydra-core==1.3.2",
             "orjson==3.11.5", "pandas==2.3.3", "pyarrow==22.0.0", "numpy==2.3.5", "packaging", "dill==0.4.0"),
            no_deps=("verl==0.9.1",),
            note="core_algos: agg_loss, GRPO advantages, kl_penalty, dual-clip"),
)}


def peers_root(root: str | os.PathLike | None = None) -> Path:
    """Where the environments live: ``$WORKBENCH_PEERS_DIR`` if set, else the user's cache
    (``$XDG_CACHE_HOME`` or ``~/.cache``) ``/workbench/peers``, outside any checkout, so a fresh clone
    (CI) reuses environments whose stamp still matches their spec instead of rebuilding ~9 GB."""
    return pinned_envs.cache_root(root, "WORKBENCH_PEERS_DIR", "peers")


def get_spec(name: str) -> EnvSpec:
    if name not in SPECS:
        raise ValueError(f"unknown peer environment {name!r}; known: {', '.join(SPECS)}")
    return SPECS[name]


def env_dir(spec: EnvSpec, root=None) -> Path:
    return peers_root(root) / spec.name


def locate(spec: EnvSpec, root=None) -> EnvStatus:
    """The environment's python if it exists and its stamp matches the spec, else why not."""
    return pinned_envs.locate(env_dir(spec, root), spec.name, spec.pins(), "peers")


def install_commands(spec: EnvSpec, python: str, constraints: str) -> list[list[str]]:
    """The pip calls, in order. torch is pinned in each call and as a constraint."""
    pip = [python, "-m", "pip", "install", "--quiet", "--prefer-binary", "-c", constraints]
    cmds = [pip + [TORCH_PIN, *spec.requirements]]
    if spec.no_build_isolation:
        cmds.append(pip + ["--no-deps", "--no-build-isolation", "setuptools", "wheel"])
        cmds.append(pip + ["--no-deps", "--no-build-isolation", *spec.no_build_isolation])
    if spec.no_deps:
        cmds.append(pip + ["--no-deps", *spec.no_deps])
    return cmds


def create(spec: EnvSpec, root=None, log=None, force: bool = False) -> EnvStatus:
    """Create (or reuse) the environment of ``spec``. Never raises for an install failure."""
    log = log or (lambda message: print(message, flush=True))
    status = locate(spec, root)
    if status.ready and not force:
        return status
    env = {**os.environ, **spec.build_env, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}

    def install(python: str, constraints: Path) -> dict:
        for cmd in install_commands(spec, python, str(constraints)):
            log("[peers]   " + " ".join(cmd[3:]))
            subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, timeout=PIP_TIMEOUT)
        pinned_envs.installed_torch(python)
        return {"freeze": pinned_envs.pip_freeze(python)}

    path = env_dir(spec, root)
    log(f"[peers] creating {path} ({spec.note})")
    status = pinned_envs.build(path, spec.name, spec.pins(), install, log, "peers")
    if status.ready:
        log(f"[peers] {spec.name} ready in {status.seconds:.0f} s")
    return status


def main(argv=None) -> int:
    """``python -m workbench.peers.envs [NAME ...]``: create the environments one at a time (soft-failing)."""
    names = list(argv if argv is not None else sys.argv[1:]) or list(SPECS)
    unknown = [n for n in names if n not in SPECS]
    if unknown:
        print(f"unknown peer environment(s) {unknown}; known: {', '.join(SPECS)}", file=sys.stderr)
        return 2
    results = [create(SPECS[n]) for n in names]
    for status in results:
        print(f"[peers] {status.name:22s} {'ready' if status.ready else 'SKIPPED: ' + status.reason[:200]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
