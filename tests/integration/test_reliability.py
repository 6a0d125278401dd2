"""Bad input, NaN, interruption: clear errors (exit code 2), kept checkpoints, exact resume after a real kill."""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from workbench.cli.main import main
from workbench.core.errors import NonFiniteError
from workbench.experiments.checkpoints import load
from workbench.modeling import tiny
from workbench.tasks import rl_problems
from workbench.trainers.checkpointing import latest_checkpoint
from workbench.trainers.grpo import GRPOConfig, GRPOTrainer


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "grpo", "--set", "beta=-1"], "beta=-1.0 must be ≥ 0"),
        (["train", "grpo", "--steps", "-3"], "GRPOConfig.steps=-3 must be ≥ 0 (set by --steps VALUE or --set steps=VALUE)"),
        (["train", "grpo", "--set", "clip_low=0"], "clip_low=0.0 must be in (0, 1)"),
        (["train", "grpo", "--set", "num_generations=1"], "num_generations=1 must be ≥ 2"),
        (["train", "grpo", "--set", "prompts_per_step=3", "--set", "mini_batches=2"], "divide prompts_per_step"),
        (["train", "grpo", "--set", "loss_agg=mean"], "loss aggregation"),
        (["train", "ppo", "--set", "kl_kind=k5"], "kl_kind='k5' is not one of"),
        (["train", "grpo", "--set", "stepz=3"], "no field 'stepz'; valid fields: steps"),
        (["train", "grpo", "--set", "steps=three"], "expects an int"),
        (["train", "grpo", "--set", "max_new_tokens=300"], "context of 256 positions"),
        (["train", "grpo", "--model", "/no/such/folder"], "does not exist"),
    ],
)
def test_bad_training_input_exits_2_naming_the_problem(argv, message, capsys):
    assert main(argv + ["--quiet"]) == 2
    assert message in capsys.readouterr().err


def test_unsafe_checkpoints_and_empty_data_exit_2(tmp_path, capsys):
    from workbench.modeling import models

    model, tokenizer = tiny.tiny_model("gpt2")
    models.save(model, tokenizer, tmp_path / "pickle")
    (tmp_path / "pickle" / "model.safetensors").unlink()
    (tmp_path / "pickle" / "pytorch_model.bin").write_bytes(b"x")
    assert main(["train", "grpo", "--model", str(tmp_path / "pickle"), "--quiet"]) == 2
    assert "pickle" in capsys.readouterr().err
    models.save(model, tokenizer, tmp_path / "padeos")
    config = json.loads((tmp_path / "padeos" / "tokenizer_config.json").read_text())
    config["pad_token"] = "<eos>"
    (tmp_path / "padeos" / "tokenizer_config.json").write_text(json.dumps(config))
    assert main(["train", "grpo", "--model", str(tmp_path / "padeos"), "--quiet"]) == 2
    assert "pad token equals its EOS" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["train", "dpo", "--data", str(tmp_path / "empty.jsonl"), "--quiet"]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["train", "dpo", "--data", str(tmp_path / "missing.jsonl"), "--quiet"]) == 2
    assert "missing" in capsys.readouterr().err


def test_nan_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    model, tokenizer = load("tiny-arith-qwen2")
    config = GRPOConfig(steps=4, progress=False, prompts_per_step=2, num_generations=4, output_dir=str(tmp_path),
                        checkpoint_every=1)
    trainer = GRPOTrainer(model, tokenizer, rl_problems(16), config)
    trainer.train(steps=2)
    good = latest_checkpoint(tmp_path)
    assert good.name == "step-000002"
    with torch.no_grad():  # poison the weights: the next step sees NaN
        next(model.parameters()).fill_(float("nan"))
    trainer.config.resume = False  # continue in memory (a resume would reload the good weights)
    with pytest.raises(NonFiniteError, match="last good checkpoint is kept"):
        trainer.train(steps=4)
    assert latest_checkpoint(tmp_path) == good
    weights = load_file(str(good / "policy.safetensors"))
    assert all(torch.isfinite(w).all() for w in weights.values())


TRAIN = [sys.executable, "-m", "workbench", "train", "grpo", "--limit", "64", "--quiet",
         "--set", "steps=12", "--set", "checkpoint_every=1", "--set", "prompts_per_step=4", "--set", "beta=0.05"]


@pytest.mark.slow  # full training / realistic checkpoints: make test-all
def test_a_killed_run_resumes_to_exactly_the_uninterrupted_result(tmp_path):
    straight = subprocess.run(TRAIN + ["--output-dir", str(tmp_path / "straight")], capture_output=True, text=True)
    assert straight.returncode == 0, straight.stderr
    # the same run, killed with SIGKILL once a few checkpoints exist
    process = subprocess.Popen(TRAIN + ["--output-dir", str(tmp_path / "killed")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        folder = latest_checkpoint(tmp_path / "killed")
        if folder is not None and int(folder.name.split("-")[1]) >= 3:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = latest_checkpoint(tmp_path / "killed")
    assert killed_at is not None and int(killed_at.name.split("-")[1]) < 12, "the run finished before it was killed"
    resumed = subprocess.run(TRAIN + ["--output-dir", str(tmp_path / "killed")], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    a = json.loads((tmp_path / "straight" / "history.json").read_text())["history"]
    b = json.loads((tmp_path / "killed" / "history.json").read_text())["history"]
    strip = lambda h: [{k: v for k, v in row.items() if "seconds" not in k} for row in h]  # noqa: E731
    assert strip(a) == strip(b)
    wa = load_file(str(latest_checkpoint(tmp_path / "straight") / "policy.safetensors"))
    wb = load_file(str(latest_checkpoint(tmp_path / "killed") / "policy.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    wa = load_file(str(latest_checkpoint(tmp_path / "straight") / "optimizer.optim.safetensors"))
    wb = load_file(str(latest_checkpoint(tmp_path / "killed") / "optimizer.optim.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_nan_loss_is_caught_before_the_optimizer_step():
    from workbench.trainers.base import check_finite_loss, clip_and_check_gradients

    with pytest.raises(NonFiniteError, match="not applied"):
        check_finite_loss(torch.tensor(float("inf")))
    parameter = torch.nn.Parameter(torch.ones(2))
    parameter.grad = torch.tensor([float("nan"), 1.0])
    with pytest.raises(NonFiniteError, match="gradient norm"):
        clip_and_check_gradients([parameter], 1.0)
