"""Measure each trainer in 1 process, under DDP with 2 processes and under FSDP2 with 2 processes, on this CPU (gloo).

Usage: ``python scripts/distributed_parity.py [--trainers grpo,dpo,ppo,sft] [--json runs/parity.json]``. Every run is
the command line's ``python -m workbench train …`` (under ``accelerate launch`` for 2 processes: ``--multi_gpu`` for
DDP, ``--use_fsdp --fsdp_version 2`` for FSDP2) with the same global batch; the table gives, per trainer and mode, the
largest |difference| of each step's loss from the 1-process run, and a resume across the change of world size: the
first half of the steps in 1 process, the rest under FSDP2 with 2, against the uninterrupted 1-process run.
The docs' table (docs/TRAINING.md, "Several processes") is this script's output.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STEPS = 4
# the smallest runs whose losses are not trivial; global batches divisible by 2 processes
RUNS = {
    "grpo": (["--limit", "64", "--set", "loss_agg=token-mean", "--set", "beta=0.05", "--set", "prompts_per_step=4",
              "--set", "num_generations=4"], ("loss",)),
    "dpo": (["--limit", "128", "--set", "batch_size=8"], ("loss",)),
    "ppo": (["--limit", "64", "--set", "prompts_per_step=4"], ("policy_loss", "value_loss")),
    "sft": (["--limit", "64", "--set", "batch_size=8", "--set", "warmup_steps=1"], ("loss",)),
}
MODES = ("1 process", "DDP 2", "FSDP2 2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(mode: str) -> list[str]:
    """``python -m workbench`` in one process, or under ``accelerate launch`` with 2 CPU processes (DDP or FSDP2)."""
    if mode == "1 process":
        return [sys.executable, "-m", "workbench"]
    strategy = ["--multi_gpu"] if mode == "DDP 2" else ["--use_fsdp", "--fsdp_version", "2"]
    return [str(BIN / "accelerate"), "launch", *strategy, "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()), "-m", "workbench"]


def train(mode: str, trainer: str, out: Path, steps: int = STEPS) -> list[dict]:
    args, _ = RUNS[trainer]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([*command(mode), "train", trainer, *args, "--set", f"steps={steps}", "--quiet", "--output-dir", str(out)],
                          capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} {trainer} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads((out / "history.json").read_text())["history"]


def largest_gap(a: list[dict], b: list[dict], keys) -> float:
    return max(abs(x[k] - y[k]) for x, y in zip(a, b, strict=True) for k in keys)


def largest_relative_gap(a: list[dict], b: list[dict], key: str = "grad_norm") -> float:
    return max(abs(x[key] - y[key]) / abs(x[key]) for x, y in zip(a, b, strict=True))


def measure(trainer: str, folder: Path) -> dict:
    _, keys = RUNS[trainer]
    histories, seconds = {}, {}
    for mode in MODES:
        start = time.perf_counter()
        histories[mode] = train(mode, trainer, folder / f"{trainer}-{mode.replace(' ', '')}")
        seconds[mode] = time.perf_counter() - start
    resumed = folder / f"{trainer}-resumed"
    train("1 process", trainer, resumed, steps=STEPS // 2)
    histories["resumed"] = train("FSDP2 2", trainer, resumed)
    one = histories["1 process"]
    return {"trainer": trainer, "keys": list(keys), "steps": STEPS,
            "loss_1_process": [[h[k] for k in keys] for h in one],
            "gap": {mode: largest_gap(one, histories[mode], keys) for mode in MODES[1:]},
            "grad_norm_relative_gap": {mode: largest_relative_gap(one, histories[mode]) for mode in MODES[1:]},
            "resume_gap": largest_gap(one[STEPS // 2:], histories["resumed"][STEPS // 2:], keys),
            "seconds": seconds}


def table(rows: list[dict]) -> str:
    lines = ["| trainer | loss(es) compared | 1 process: largest \\|loss\\| | DDP 2: max \\|Δ\\| | FSDP2 2: max \\|Δ\\| "
             "| resume 1 → FSDP2 2: max \\|Δ\\| | grad norm, max relative \\|Δ\\|: DDP 2 / FSDP2 2 |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        scale = max(abs(v) for step in row["loss_1_process"] for v in step)
        lines.append(f"| {row['trainer']} | {', '.join(row['keys'])} | {scale:.3g} | {row['gap']['DDP 2']:.1e} | "
                     f"{row['gap']['FSDP2 2']:.1e} | {row['resume_gap']:.1e} | "
                     f"{row['grad_norm_relative_gap']['DDP 2']:.1e} / {row['grad_norm_relative_gap']['FSDP2 2']:.1e} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainers", default=",".join(RUNS))
    parser.add_argument("--json", default=None, help="also write the measurements here")
    args = parser.parse_args()
    if shutil.which("accelerate", path=str(BIN)) is None:
        print("error: accelerate is not installed next to this Python; pip install -e '.[peers]'", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="parity-") as folder:
        for trainer in args.trainers.split(","):
            rows.append(measure(trainer, Path(folder)))
            print(json.dumps(rows[-1]), flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
