"""Scale-out: the training entry point under ``accelerate launch`` with 2 CPU processes (gloo), DDP or FSDP2,
gives the same losses as one process with the same global batch, for every trainer; a checkpoint written under FSDP2
resumes in one process; FSDP1 is refused by name. The measured differences: docs/TRAINING.md, "Several processes"."""

import json
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(shutil.which("accelerate", path=str(BIN)) is None, reason="accelerate is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workbench_command(processes: int, strategy: str = "ddp") -> list[str]:
    """``python -m workbench``, under ``accelerate launch`` with ``processes`` CPU processes when more than one (``strategy``
    ``ddp``: ``--multi_gpu``; ``fsdp2``: ``--use_fsdp --fsdp_version 2``)."""
    if processes == 1:
        return [sys.executable, "-m", "workbench"]
    launch = ["--multi_gpu"] if strategy == "ddp" else ["--use_fsdp", "--fsdp_version", "2"]
    return [str(BIN / "accelerate"), "launch", *launch, "--num_processes", str(processes), "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()), "-m", "workbench"]


def train(tmp_path: Path, name: str, args: list[str], processes: int, strategy: str = "ddp") -> list[dict]:
    out = tmp_path / name
    command = workbench_command(processes, strategy)
    done = subprocess.run(command + ["train", *args, "--quiet", "--output-dir", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "history.json").read_text())["history"]


@pytest.mark.parametrize(
    "args, keys",
    [
        (["grpo", "--limit", "64", "--set", "steps=3", "--set", "loss_agg=token-mean", "--set", "beta=0.05",
          "--set", "prompts_per_step=4", "--set", "num_generations=4"], ("loss", "kl", "entropy", "grad_norm", "reward")),
        pytest.param(["dpo", "--limit", "128", "--set", "steps=3", "--set", "batch_size=8"], ("loss", "rewards/margins", "grad_norm"),
                     marks=pytest.mark.slow),  # the same gradient all-reduce as GRPO's case (13 s): make test-all
    ],
    ids=["grpo", "dpo"],
)
def test_two_cpu_processes_match_one(tmp_path, args, keys):
    single = train(tmp_path, "single", args, processes=1)
    double = train(tmp_path, "ddp", args, processes=2)
    assert len(single) == len(double) == 3
    for a, b in zip(single, double, strict=False):
        for key in keys:
            assert a[key] == pytest.approx(b[key], abs=1e-5, rel=1e-4), key
    assert any(abs(h["loss"]) > 1e-5 for h in single)  # a comparison of non-trivial numbers


RUNS = {  # the smallest runs with non-trivial losses (global batches divisible by 2); scripts/distributed_parity.py's
    "grpo": (["grpo", "--limit", "64", "--set", "steps=3", "--set", "loss_agg=token-mean", "--set", "beta=0.05",
              "--set", "prompts_per_step=4", "--set", "num_generations=4"], ("loss", "kl", "grad_norm")),
    "dpo": (["dpo", "--limit", "128", "--set", "steps=3", "--set", "batch_size=8"], ("loss", "rewards/margins", "grad_norm")),
    "ppo": (["ppo", "--limit", "64", "--set", "steps=3", "--set", "prompts_per_step=4"], ("policy_loss", "value_loss", "grad_norm")),
    "sft": (["sft", "--limit", "64", "--set", "steps=3", "--set", "batch_size=8", "--set", "warmup_steps=1"], ("loss", "grad_norm")),
}


@pytest.mark.slow  # 40-80 s each: two launched processes against one
@pytest.mark.parametrize("trainer, strategy", [("ppo", "ddp"), ("sft", "ddp"), ("grpo", "fsdp2"), ("dpo", "fsdp2"),
                                               ("ppo", "fsdp2"), ("sft", "fsdp2")])
def test_every_trainer_in_two_processes_matches_one(tmp_path, trainer, strategy):
    args, keys = RUNS[trainer]
    single = train(tmp_path, "single", args, processes=1)
    double = train(tmp_path, strategy, args, processes=2, strategy=strategy)
    assert len(single) == len(double) == 3
    for a, b in zip(single, double, strict=True):
        for key in keys:
            assert a[key] == pytest.approx(b[key], abs=1e-5, rel=1e-4), key
    assert any(abs(h[keys[0]]) > 1e-4 for h in single)  # a comparison of non-trivial numbers (GRPO's loss: ~5e-4)


@pytest.mark.slow  # ~90 s: a run split over two world sizes against the uninterrupted one
def test_a_checkpoint_written_under_fsdp2_resumes_in_one_process(tmp_path):
    args, keys = RUNS["sft"]
    whole = train(tmp_path, "whole", args, processes=1)
    halves = [a.replace("steps=3", "steps=2") for a in args]
    first = train(tmp_path, "split", halves, processes=2, strategy="fsdp2")  # a checkpoint of gathered, full tensors
    resumed = train(tmp_path, "split", args, processes=1)  # the same folder: resumes at step 2
    assert len(first) == 2 and len(resumed) == 3 and resumed[:2] == first
    assert resumed[2]["loss"] == pytest.approx(whole[2]["loss"], abs=1e-5, rel=1e-4)
    assert resumed[2]["loss"] != pytest.approx(whole[0]["loss"], abs=1e-3)  # step 2 was trained from the resumed state


def test_fsdp1_is_refused_by_name(monkeypatch):
    from workbench.core.errors import ConfigError
    from workbench.trainers.distributed import Distributed

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(ConfigError, match=r"FSDP version 1 .*--fsdp_version 2"):
        Distributed()


@pytest.mark.slow  # 20 s of two launched processes: make test-slow (CI runs it)
def test_a_held_output_folder_stops_the_launched_group_with_the_refusal_as_its_cause(tmp_path, hold_elsewhere):
    out = tmp_path / "held"
    command = [*workbench_command(2), "train", "grpo", "--limit", "8", "--set", "steps=2", "--set", "prompts_per_step=2",
               "--set", "num_generations=2", "--quiet", "--output-dir", str(out)]
    with hold_elsewhere(out):
        done = subprocess.run(command, capture_output=True, text=True, timeout=180)  # not the others waiting in a collective
    assert "is being written by another training (pid " in done.stderr, done.stderr[-3000:]
    # the launcher's first observed failure is the refusal (exit 2) — not a crash, an abort or a collective's timeout;
    # the launcher then stops whichever rank is left (torchrun's way), so only the first is asserted
    root_cause = done.stderr.split("Root Cause (first observed failure):")[-1]
    assert done.returncode != 0 and re.search(r"exitcode +: +2\b", root_cause), done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing trained, nothing written


@pytest.mark.parametrize("trainer, field, value", [("grpo", "sampler_precision", "bf16"), ("ppo", "rollout_staleness", 1)])
def test_a_separate_sampler_is_refused_by_name_under_fsdp2(monkeypatch, trainer, field, value):
    from types import SimpleNamespace

    from workbench.core.errors import ConfigError
    from workbench.experiments.checkpoints import load
    from workbench.tasks import rl_problems
    from workbench.trainers.distributed import Distributed
    from workbench.trainers.registry import trainer_classes

    monkeypatch.setattr(Distributed, "_current", SimpleNamespace(fsdp=True, enabled=True))  # as under --fsdp_version 2
    config_cls, trainer_cls = trainer_classes(trainer)
    model, tokenizer = load("tiny-arith-qwen2")
    with pytest.raises(ConfigError, match=re.escape(f"{field}={value!r}") + " under FSDP2: .* or DDP"):
        trainer_cls(model, tokenizer, rl_problems(4), config_cls(steps=1, progress=False, **{field: value}))
