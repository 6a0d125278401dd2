"""Probes of TRL 1.16 (the `peers` extra) through `workbench.audit`: each convention measured by running TRL."""

import os

import pytest

from workbench.experiments.checkpoints import load
from workbench.modeling.tiny import tiny_model
from workbench.peers import trl_host as probes
from workbench.tasks import TEST_PREFERENCES, load_preferences

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.skipif(not probes.trl_available()[0], reason="TRL is not installed (pip install -e '.[peers]')")


@pytest.fixture(scope="module")
def checkpoint():
    model, tokenizer = load("tiny-arith-qwen2")
    return model, tokenizer, probes.model_folder(model, tokenizer)


@pytest.mark.slow  # full training / realistic checkpoints: make test-all
def test_trl_loss_types_are_classified_as_the_audit_modes(checkpoint):
    _, tokenizer, folder = checkpoint
    results = probes.probe_grpo_aggregation(folder, tokenizer)
    assert {k: r.details["mode"] for k, r in results.items()} == {
        "grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm"}
    assert all(r.passed for r in results.values())
    assert "B × 8" in results["dr_grpo"].details["norm_constant_scaling"]  # B × max_completion_length
    assert abs(results["grpo"].details["value"]) < 1e-6 < abs(results["bnpo"].details["value"])  # the S5 probe


def test_trl_grpo_logprobs_have_the_s1_gap_on_gpt2_only():
    results = {}
    for arch in ("gpt2", "llama"):
        model, tokenizer = tiny_model(arch)
        results[arch] = probes.probe_position_ids(probes.model_folder(model, tokenizer), tokenizer)
    assert results["gpt2"].convention == "model default" and results["gpt2"].details["max_abs_gap"] > 1e-2
    assert not results["gpt2"].passed
    assert results["llama"].details["max_abs_gap"] < 1e-4 and not results["llama"].details["absolute_positions"]


def test_trl_dpo_masks_prompts_and_reloads_the_reference_from_disk(checkpoint):
    model, tokenizer, _ = checkpoint
    result = probes.probe_dpo(model, tokenizer, load_preferences(TEST_PREFERENCES)[:4])
    assert result["prompt_masked_both_sides"] and result["policy_vs_with_prompt"] > 1
    assert result["reference"] == "reloaded from disk"


def test_trl_grpo_generation_stops_at_eos(checkpoint):
    _, tokenizer, folder = checkpoint
    result = probes.probe_eos(folder, tokenizer, max_completion_length=32)
    assert result["stops_at_eos"] and result["tokens_generated_per_row"] < 32
