"""P12 from verl's rollout-correction diagnostics (``workbench.watch.mismatch``): in deep mode the watch re-scores a
rollout drawn by another model than the policy and reports ``chi2_token``, the ESS share, KL… as evidence, with the
severity verl's health thresholds give. Planted gaps (a bf16 sampler, weights one optimiser update old) are flagged
with their numbers; an fp32 copy of the same weights is not."""

import copy
import math

import pytest
import torch

from workbench.modeling.rollout import sample
from workbench.modeling.tiny import tiny_model
from workbench.watch import mismatch
from workbench.watch.watcher import watch


def test_diagnose_thresholds_on_hand_computed_ratios():
    rollout = torch.full((2, 3), -1.0)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # ρ = 2 on every token: χ²_token = E[ρ²] − 1 = 3, kl = E[log π_rollout − log π] = −log 2 (verl's health check: error)
    severity, evidence, crossed = mismatch.diagnose(rollout + math.log(2.0), rollout, mask)
    assert severity == "error" and evidence["tokens"] == 5
    assert evidence["chi2_token"] == pytest.approx(3.0, rel=1e-5) and evidence["kl"] == pytest.approx(-math.log(2.0), rel=1e-5)
    assert any(text.startswith("chi2_token 3 > 1.0") for text in crossed) and any(text.startswith("kl ") for text in crossed)
    # ρ = e^0.01: χ² = e^0.02 − 1 ≈ 0.0202, under every health bound but far above float noise: a warning
    severity, evidence, crossed = mismatch.diagnose(rollout + 0.01, rollout, mask)
    assert severity == "warning" and crossed == []
    assert evidence["chi2_token"] == pytest.approx(math.expm1(0.02), rel=1e-4)
    assert evidence["max_abs_delta_logp"] == pytest.approx(0.01, rel=1e-4)
    # |log ρ| = 1e-5: float noise, nothing
    assert mismatch.diagnose(rollout + 1e-5, rollout, mask)[0] is None
    # a NaN log-prob cannot form a ratio: not judged here
    assert mismatch.diagnose(torch.full((2, 3), float("nan")), rollout, mask)[0] is None


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return tiny_model("qwen2", hidden_size=96, num_attention_heads=3, num_key_value_heads=1)


def draw_and_train(policy, tokenizer, sampler, optimizer=None):
    """Sample 4 rows with ``sampler`` under a deep watch of ``policy``, then train ``policy`` on them (one step)."""
    ids = torch.tensor([[tokenizer.pad_token_id, 10, 11, 12], [13, 14, 15, 16]] * 2)
    mask = (ids != tokenizer.pad_token_id).long()
    with watch(policy, tokenizer=tokenizer, optimizer=optimizer, deep=True) as watcher:
        rollout = sample(sampler, ids, mask, max_new_tokens=6, eos_token_id=2, pad_token_id=tokenizer.pad_token_id,
                         generator=torch.Generator().manual_seed(0))
        full = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)
        full_mask = torch.cat([rollout.prompt_mask, rollout.response_mask], 1)
        position_ids = (full_mask.cumsum(-1) - 1).clamp(min=0)
        policy(input_ids=full, attention_mask=full_mask, position_ids=position_ids).logits.float().logsumexp(-1).mean().backward()
    return [f for f in watcher.report().findings if f.pitfall == "P12"], int(rollout.response_mask.sum())


def test_an_fp32_copy_of_the_same_weights_gives_no_finding(model):
    policy, tokenizer = model
    findings, _ = draw_and_train(policy, tokenizer, copy.deepcopy(policy))
    assert findings == []


def test_a_bf16_sampler_is_flagged_with_the_rollout_corr_numbers(model):
    policy, tokenizer = model
    findings, tokens = draw_and_train(policy, tokenizer, copy.deepcopy(policy).to(torch.bfloat16))
    assert len(findings) == 1
    evidence = findings[0].evidence
    assert evidence["sampler_dtype"] == "bfloat16" and evidence["tokens"] == tokens and evidence["step"] == 0
    assert mismatch.NOISE_LOG_RATIO < evidence["max_abs_delta_logp"] < 1.0
    assert 0 < evidence["chi2_token"] < 1.0 and 0.3 < evidence["rollout_is_eff_sample_size"] <= 1.0


def test_weights_an_update_old_are_flagged_as_an_error_past_verl_thresholds(model):
    policy, tokenizer = model
    policy = copy.deepcopy(policy)
    stale = copy.deepcopy(policy)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.grad = 0.3 * torch.randn_like(parameter)
    with watch(policy, tokenizer=tokenizer, optimizer=optimizer):
        optimizer.step()  # the policy moves; ``stale`` keeps the weights of before the update
    findings, tokens = draw_and_train(policy, tokenizer, stale, optimizer)
    assert len(findings) == 1 and findings[0].severity == "error"
    evidence = findings[0].evidence
    assert evidence["tokens"] == tokens and "sampler_dtype" not in evidence
    assert evidence["thresholds_crossed"] and "verl" in findings[0].message
    assert evidence["chi2_token"] > 1.0 or evidence["rollout_is_eff_sample_size"] < 0.3 or abs(evidence["kl"]) > 0.1
