"""``python -m workbench audit``: exit 0 when the check passes, 1 when it fails, 2 on bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.audit import AuditResult
from workbench.cli.main import main

REPO = Path(__file__).resolve().parents[2]
BUGGY = "examples/buggy_trainers.py"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", "audit", *args], cwd=REPO, capture_output=True, text=True)


def test_exit_codes_through_a_real_process():
    failed = run_cli("examples/buggy_trainers.py:grpo_loss", "--check", "aggregation", "--expect", "grpo")
    assert failed.returncode == 1, failed.stderr
    assert failed.stdout.strip() == ("[FAIL] aggregation: token-mean (expected seq-mean-token-mean) · "
                                     "loss of a zero-mean advantage group at ρ = 1 = 0.3824")
    passed = run_cli("examples.correct_trainers:dpo_batch_logps", "--check", "dpo_mask", "--json")  # dotted module from the cwd
    assert passed.returncode == 0, passed.stderr
    result = AuditResult.from_dict(json.loads(passed.stdout))
    assert result.passed and result.details["prompt_tokens_counted"] == {"chosen": 0, "rejected": 0}
    bad = run_cli("examples/buggy_trainers.py:grpo_loss", "--check", "position_ids")
    assert bad.returncode == 2 and "pass --model" in bad.stderr


@pytest.mark.parametrize("args, code, where, text", [
    ([f"{BUGGY}:dpo_batch_logps", "--check", "dpo_mask"], 1, "out", "rejected rows keep their prompt"),
    ([f"{BUGGY}:micro_batch_loss", "--check", "grad_accumulation"], 1, "out", "= 0.7455"),
    (["examples/correct_trainers.py:micro_batch_loss", "--check", "grad_accumulation"], 0, "out", "[PASS]"),
    ([f"{BUGGY}:generate_without_eos", "--check", "eos", "--model", "tiny-arith-gpt2"], 1, "out",
     "wasted decoding steps = 11"),
    ([f"{BUGGY}:logprobs_without_temperature", "--check", "temperature", "--model", "tiny-arith-gpt2"], 2, "err",
     "needs --temperature"),
    ([f"{BUGGY}:logprobs_without_temperature", "--check", "temperature", "--model", "tiny-arith-gpt2",
      "--temperature", "0.7"], 1, "out", "no temperature"),
    ([f"{BUGGY}:nope", "--check", "dpo_mask"], 2, "err", "no attribute 'nope'"),
    (["examples/missing.py:f", "--check", "dpo_mask"], 2, "err", "no such file"),
    (["not_a_module_xyz:f", "--check", "dpo_mask"], 2, "err", "cannot import module"),
    ([f"{BUGGY}:grpo_loss", "--check", "grad_accumulation"], 2, "err", "cannot be called as loss_fn"),
    ([f"{BUGGY}:grpo_loss", "--check", "aggregation", "--expect", "mean"], 2, "err", "unknown aggregation mode"),
    ([f"{BUGGY}:generate_without_eos", "--check", "eos", "--model", "no-such-model"], 2, "err", "cannot load"),
])
def test_exit_codes_and_messages(args, code, where, text, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["audit", *args]) == code
    captured = capsys.readouterr()
    assert text in (captured.out if where == "out" else captured.err)


def test_a_crash_inside_the_audited_function_exits_3_with_its_line(tmp_path):
    """Not a failed check (1) nor bad input (2): the user's frame is shown, and a CI step can tell the difference."""
    user = tmp_path / "my_trainer.py"
    user.write_text("def logprobs(model, batch, temperature):\n"
                    "    ids = batch['input_ids']  # a dict in the user's trainer; the check passes tensors\n"
                    "    return ids\n")
    done = subprocess.run([sys.executable, "-m", "workbench", "audit", f"{user}:logprobs", "--check", "position_ids",
                           "--model", "tiny-gpt2"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 3, done.stderr
    assert "crash:" in done.stderr and "IndexError" in done.stderr
    assert f'File "{user}", line 2, in logprobs' in done.stderr and "ids = batch['input_ids']" in done.stderr
    assert "not a bug detected by --check position_ids" in done.stderr and done.stdout == ""


def test_a_file_target_imports_its_sibling_modules_from_another_folder(tmp_path):
    package = tmp_path / "trainer"
    package.mkdir()
    (package / "helpers.py").write_text("from workbench.audit.dpo import EXPECTED  # noqa\n")
    (package / "losses.py").write_text("import helpers  # a sibling module, as in the user's repository\n"
                                       "from examples.correct_trainers import dpo_batch_logps  # noqa: F401\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-m", "workbench", "audit", str(package / "losses.py") + ":dpo_batch_logps",
                           "--check", "dpo_mask"], cwd=elsewhere, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("[PASS] dpo_mask")


def test_step0_on_a_model_without_dropout_says_p7_was_not_exercised(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["audit", "examples/correct_trainers.py:step", "--check", "step0", "--model", "tiny-gpt2"]) == 0
    printed = capsys.readouterr().out
    assert "P7 (dropout) not exercised" in printed and "rerun with --dropout 0.1" in printed
    assert main(["audit", "examples/correct_trainers.py:step", "--check", "step0", "--model", "tiny-gpt2",
                 "--dropout", "0.1", "--json"]) == 0  # eval() in the step: dropout on, yet ρ = 1
    result = AuditResult.from_json(capsys.readouterr().out)
    assert result.details["dropout_sites"] > 0 and "p7" not in result.details
    assert main(["audit", f"{BUGGY}:grpo_loss", "--check", "aggregation", "--dropout", "0.1"]) == 2
    assert "--dropout applies to a loaded --model" in capsys.readouterr().err
