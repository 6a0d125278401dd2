"""``python -m workbench audit``: exit 0 when the check passes, 1 when it fails, 2 on bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.audit import AuditResult
from workbench.cli.main import main

REPO = Path(__file__).resolve().parent.parent
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
