"""workbench.audit: every check on the buggy examples (fails, with its number) and on the correct
adapters (passes), signature errors, the JSON round trip, and the import-light contract."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench.audit import (
    AuditResult,
    AuditSignatureError,
    check_aggregation,
    check_dpo_mask,
    check_eos_stopping,
    check_grad_accumulation,
    check_position_ids,
    check_step0,
    check_temperature,
    report,
    report_html,
)
from workbench.audit import suite as audit_suite
from workbench.audit.loading import load_callable, load_module
from workbench.core import losses
from workbench.core.errors import AuditInputError
from workbench.experiments.checkpoints import load
from workbench.pitfalls.nb07_dropout import set_dropout

pytestmark = pytest.mark.numeric  # held to AVX2 in .ci/run (docs/CPU_PORTABILITY.md)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
buggy = load_module(str(EXAMPLES / "buggy_trainers.py"))
correct = load_module(str(EXAMPLES / "correct_trainers.py"))


@pytest.fixture(scope="module")
def gpt2():
    return load("tiny-arith-gpt2")


@pytest.fixture(scope="module")
def qwen():
    return load("tiny-arith-qwen2")


# ---- import contract -----------------------------------------------------------------------
def test_importing_the_audit_package_loads_neither_transformers_nor_matplotlib():
    code = ("import sys, workbench.audit; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('transformers', 'matplotlib', 'trl', 'datasets')]; print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# ---- aggregation (S5) -----------------------------------------------------------------------
@pytest.mark.parametrize("mode, zero_mean_loss, empty", [
    ("token-mean", 6.5 / 17, "n/a"),  # −Σ A_i L_i / Σ L_i with A = [1.5, −.5, −.5, −.5], L = [1, 3, 5, 8]
    ("seq-mean-token-mean", 0.0, "dropped"),
    ("seq-mean-token-sum", 6.5 / 4, "dropped"),
    ("seq-mean-token-sum-norm", 6.5 / (4 * 16), "dropped"),  # verl 0.9.1: non-empty rows × horizon
    ("grpo", 0.0, "counted"),  # TRL 1.16 aliases count an empty row
    ("dr_grpo", 6.5 / (4 * 16), "counted"),
])
def test_aggregation_classifies_every_workbench_mode(mode, zero_mean_loss, empty):
    result = check_aggregation(lambda x, m: losses.aggregate_loss(x, m, mode, max_len=16))
    canonical = losses.canonical_loss_agg(mode)
    assert result.passed and result.convention == canonical == result.details["mode"]
    assert result.value == pytest.approx(zero_mean_loss, abs=1e-7)
    assert result.details["empty_rows"].startswith(empty)


def test_aggregation_recovers_the_norm_constant_and_trl_aliases():
    dr_grpo = check_aggregation(lambda x, m: losses.aggregate_loss(x, m, "seq-mean-token-sum-norm", max_len=16))
    assert dr_grpo.details["norm_constant"] == pytest.approx(64) and dr_grpo.details["norm_constant_scaling"] == "B × 16"
    assert dr_grpo.details["trl_alias"] == "dr_grpo"
    verl = check_aggregation(lambda x, m: (x * m).sum() / m.shape[-1])  # verl: Σ / horizon
    assert verl.details["mode"] == "seq-mean-token-sum-norm" and verl.details["norm_constant_scaling"] == "fixed 8 (= T)"
    trl_grpo = check_aggregation(lambda x, m: ((x * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean())
    assert trl_grpo.details["trl_alias"] == "grpo" and trl_grpo.details["empty_rows"].startswith("counted")


def test_aggregation_buggy_grpo_loss_is_a_token_mean_and_fails_its_claim():
    result = check_aggregation(buggy.grpo_loss, expected="grpo")
    assert not result.passed and result.details["mode"] == "token-mean"
    assert result.convention == "token-mean (expected seq-mean-token-mean)"
    assert result.value == pytest.approx(6.5 / 17, abs=1e-7)  # 0.382, where the GRPO paper's loss is 0
    fixed = check_aggregation(correct.grpo_loss, expected="grpo")
    assert fixed.passed and fixed.value == pytest.approx(0.0, abs=1e-7)


def test_aggregation_unknown_nan_and_masked_leaks():
    assert check_aggregation(lambda x, m: x.mean()).details["mode"] == "unknown"  # ignores the mask
    assert check_aggregation(lambda x, m: (x * m).sum() ** 2).details["mode"] == "unknown"  # nonlinear
    nan = check_aggregation(lambda x, m: ((x * m).sum(-1) / m.sum(-1)).mean())  # 0/0 on an empty row
    assert nan.details["mode"] == "seq-mean-token-mean" and nan.details["empty_rows"].startswith("NaN") and not nan.passed


# ---- position ids (S1) ----------------------------------------------------------------------
def test_position_ids_bug_and_fix_on_gpt2(gpt2):
    model, tokenizer = gpt2
    bug = check_position_ids(buggy.logprobs_without_position_ids, model, tokenizer)
    fix = check_position_ids(correct.logprobs, model, tokenizer)
    assert not bug.passed and bug.convention == "model default" and bug.details["absolute_positions"]
    assert bug.details["max_abs_gap"] == pytest.approx(21.99, abs=0.01)  # the position shift; fp32 noise is ~1e-5 of it
    assert bug.details["max_abs_gap_right"] < 1e-5  # not exact: the right-padded copy runs other matmul shapes (fp32 order)
    assert fix.passed and fix.convention == "mask-derived" and fix.details["max_abs_gap"] < 1e-5


def test_position_ids_is_undetermined_on_a_rotary_model(qwen):
    model, tokenizer = qwen
    result = check_position_ids(buggy.logprobs_without_position_ids, model, tokenizer)
    assert not result.passed and result.convention.startswith("undetermined") and not result.details["absolute_positions"]
    assert result.details["max_abs_gap"] < 1e-4


# ---- temperature (P6) -----------------------------------------------------------------------
def test_temperature_bug_and_fix(gpt2):
    model, tokenizer = gpt2
    bug = check_temperature(buggy.logprobs_without_temperature, model, tokenizer, 0.7)
    fix = check_temperature(correct.logprobs_at_temperature, model, tokenizer, 0.7)
    assert not bug.passed and bug.convention.startswith("no temperature")
    assert bug.details["max_abs_gap"] == pytest.approx(9.613, abs=1e-3)
    assert bug.details["effective_temperature"] == pytest.approx(1.0, abs=1e-4)
    assert fix.passed and fix.details["max_abs_gap"] < 1e-5
    assert fix.details["effective_temperature"] == pytest.approx(0.7, abs=1e-4)
    with pytest.raises(ValueError, match="≠ 1"):
        check_temperature(correct.logprobs, model, tokenizer, 1.0)


# ---- DPO mask (S4) --------------------------------------------------------------------------
def test_dpo_mask_bug_and_fix():
    bug = check_dpo_mask(buggy.dpo_batch_logps)
    assert not bug.passed and bug.convention.startswith("chosen prompts only")
    assert bug.details["prompt_tokens_counted"] == {"chosen": 0, "rejected": 6} and bug.value == 6  # (2−1)+(3−1)+(4−1)
    fix = check_dpo_mask(correct.dpo_batch_logps)
    assert fix.passed and fix.value == 0 and fix.details["response_reduction"] == "sum"
    mean = check_dpo_mask(lambda lp, am, pl: correct.dpo_batch_logps(lp, am, pl) / (am.sum(-1) - torch.tensor(pl * 2)))
    assert mean.passed and mean.details["response_reduction"] == "mean"


# ---- EOS stopping (S3) ----------------------------------------------------------------------
def test_eos_stopping_bug_and_fix_and_the_hook_is_removed(gpt2):
    model, tokenizer = gpt2
    bug = check_eos_stopping(buggy.generate_without_eos, model, tokenizer)
    assert not bug.passed and bug.convention == "runs to max_new_tokens (no EOS stopping)"
    assert (bug.details["forwards"], bug.details["longest_needed"], bug.value) == (16, 5, 11)
    assert bug.details["tokens_generated"] == 64 and bug.details["tokens_needed"] == 14  # 2 + 3 + 4 + 5
    fix = check_eos_stopping(correct.generate, model, tokenizer)
    assert fix.passed and fix.details["forwards"] == 5 and fix.value == 0 and fix.details["eos_positions"] == [1, 2, 3, 4]
    assert not model._forward_hooks and not model._forward_hooks_with_kwargs


# ---- step 0 (P12) ------------------------------------------------------------------------------
def test_step0_bug_and_fix(qwen):
    model, tokenizer = qwen
    bug = check_step0(buggy.step_with_rollout_logprobs, model, tokenizer)
    assert not bug.passed and bug.convention.startswith("π_old ≠ π_θ")
    # bf16 engine vs fp32 trainer: the engine's log-probs carry bf16 rounding (2⁻⁸ relative), far above fp32's 1e-4
    # tolerance and far below a real bug's error; the exact value depends on the CPU's bf16 kernels and thread count
    assert 1e-3 < bug.value < 0.2
    assert bug.details["max_abs_ref_log_ratio"] == 0.0  # exact: the reference is an identical copy, same shapes, same process
    fix = check_step0(correct.step, model, tokenizer)
    # exact: π_old and π_θ are the same forward on the same shapes in one process, the reference an identical copy
    assert fix.passed and fix.value == 0.0 and fix.details["kl_k1_per_sequence"] == 0.0 and fix.details["clip_fraction"] == 0.0
    assert fix.details["max_abs_rollout_vs_old"] < 1e-5  # sampler (KV cache, other shapes) vs training forward: fp32 noise


def test_step0_dropout_left_on_and_weights_changed(gpt2):
    model, tokenizer = gpt2
    noisy = copy.deepcopy(model)
    set_dropout(noisy, 0.1)

    def train_mode_step(policy, reference, prompt_ids, prompt_mask):  # P7: nobody called eval()
        policy.train()
        reference.train()
        return correct.step(policy, reference, prompt_ids, prompt_mask)

    dropout_on = check_step0(train_mode_step, noisy, tokenizer)
    assert not dropout_on.passed and dropout_on.value > 0.1 and dropout_on.details["max_abs_ref_log_ratio"] > 0.1
    assert not noisy.training  # the check restored the modules' modes

    def updating_step(policy, reference, prompt_ids, prompt_mask):
        with torch.no_grad():
            next(policy.parameters()).add_(1.0)
        return correct.step(policy, reference, prompt_ids, prompt_mask)

    changed = check_step0(updating_step, copy.deepcopy(model), tokenizer)
    assert not changed.passed and changed.details["weights_changed"] and changed.convention.startswith("the weights changed")
    with pytest.raises(AuditSignatureError, match="no 'mask'"):
        check_step0(lambda p, r, i, m: {"old_logprobs": torch.zeros(2, 2), "logprobs": torch.zeros(2, 2)}, model, tokenizer)


# ---- gradient accumulation (P10) ------------------------------------------------------------------
def test_grad_accumulation_bug_and_fix():
    bug = check_grad_accumulation(buggy.micro_batch_loss)
    assert not bug.passed and bug.convention.startswith("mean of per-micro-batch token means")
    assert bug.value == pytest.approx(0.7455, abs=1e-4)
    assert bug.details["micro_batch_tokens"] == [3, 5, 13, 16] and bug.details["weight_spread"] == pytest.approx(16 / 3, rel=1e-5)
    fix = check_grad_accumulation(correct.micro_batch_loss)
    assert fix.passed and fix.value < 1e-6 and fix.details["weight_spread"] == pytest.approx(1.0, abs=1e-5)


# ---- signatures, results, report -------------------------------------------------------------
def test_wrong_signatures_name_the_expected_one(gpt2):
    model, tokenizer = gpt2
    with pytest.raises(AuditSignatureError, match=r"loss_fn\(per_token_loss: Tensor\[B, T\], mask"):
        check_aggregation(lambda per_token_loss: per_token_loss.sum())
    with pytest.raises(AuditSignatureError, match=r"logprob_fn\(model, input_ids"):
        check_position_ids(lambda model, ids: ids, model, tokenizer)
    with pytest.raises(AuditSignatureError, match="batch_logps_fn"):
        check_dpo_mask(lambda *args: torch.zeros(2))  # wrong return shape
    def three(per_token_loss, mask, num_items):
        return per_token_loss.sum() / num_items

    def star_args(*args):  # passes inspect.signature, fails on the first call
        return three(*args)

    with pytest.raises(AuditSignatureError, match="raised TypeError.*missing 1 required"):
        check_aggregation(star_args)
    with pytest.raises(AuditSignatureError, match="expected a callable"):
        check_aggregation("not a function")


def test_results_round_trip_through_json_and_render():
    results = [check_aggregation(buggy.grpo_loss, expected="grpo"), check_dpo_mask(correct.dpo_batch_logps)]
    back = [AuditResult.from_dict(json.loads(json.dumps(r.to_dict()))) for r in results]
    assert back == results
    assert str(back[0]) == ("[FAIL] aggregation: token-mean (expected seq-mean-token-mean) · "
                            "loss of a zero-mean advantage group at ρ = 1 = 0.3824")
    text = report(results)
    assert "FAIL" in text and "PASS" in text and text.endswith("1/2 checks passed")
    assert report(back, fmt="html") == report_html(results) and "<table" in report_html(results)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2)
    for r, ax in zip(back, axes, strict=False):
        r.plot(ax)
    assert axes[0].get_title().startswith("aggregation · FAIL")
    plt.close(fig)
    with pytest.raises(ValueError, match="missing"):
        AuditResult.from_dict({"name": "x"})


def test_load_callable_errors_name_the_problem():
    assert load_callable(f"{EXAMPLES / 'buggy_trainers.py'}:grpo_loss").__name__ == "grpo_loss"
    with pytest.raises(AuditInputError, match="MODULE:FUNCTION"):
        load_callable("no_colon")
    with pytest.raises(AuditInputError, match="no attribute 'nope'.*grpo_loss"):
        load_callable(f"{EXAMPLES / 'buggy_trainers.py'}:nope")
    with pytest.raises(AuditInputError, match="cannot import"):
        load_callable("surely_not_a_module_xyz:f")


def test_run_checks_and_verdict_on_the_example_files(gpt2):
    model, tokenizer = gpt2
    subset = {k: buggy.AUDIT[k] for k in ("aggregation", "dpo_mask", "grad_accumulation")}
    bug = audit_suite.run_checks(subset, **buggy.AUDIT_OPTIONS, label="buggy")
    fix = audit_suite.run_checks({k: correct.AUDIT[k] for k in subset}, **correct.AUDIT_OPTIONS, label="fixed")
    assert [r.name for r in bug] == ["aggregation", "dpo_mask", "grad_accumulation"] and bug[0].details["label"] == "buggy"
    assert audit_suite.verdict(bug, fix) == (True, True)
    assert audit_suite.verdict(fix, fix) == (False, True) and audit_suite.verdict(bug, bug) == (True, False)  # bug-absent inputs
    assert audit_suite.verdict([], fix) == (False, True)
    with pytest.raises(ValueError, match="need model= and tokenizer="):
        audit_suite.run_checks({"eos": correct.generate})
    with pytest.raises(ValueError, match="unknown check"):
        audit_suite.run_checks({"eos_stop": correct.generate}, model, tokenizer)


def test_the_docs_example_of_wrapping_a_trainer_loss_for_check_aggregation_runs():
    """docs/AUDIT.md's code block (marked aggregation-example) runs as written and finds the loss's convention."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "AUDIT.md").read_text()
    block = re.search(r"<!-- aggregation-example .*?-->\n```python\n(.*?)```", page, re.DOTALL)
    assert block is not None, "docs/AUDIT.md lost its check_aggregation example"
    namespace: dict = {}
    exec(compile(block.group(1), "docs/AUDIT.md", "exec"), namespace)
    result = namespace["result"]
    assert result.passed and result.convention.startswith("token-mean")
