"""P17, P19, P21, P22, P23: each pitfall's signature with the switch on, its absence with the fix,
hand-computed values where maths is involved, and verdicts that say False on bug-absent numbers."""

import copy

import pytest
import torch

from workbench.diagnostics import bf16_updates
from workbench.models import load


@pytest.fixture(scope="module")
def qwen():
    return load("tiny-arith-qwen2")


# ---- P23 pure-bf16 updates ---------------------------------------------------------------------
def test_p23_bf16_spacing_by_hand():
    assert float(bf16_updates.bf16_ulp(1.0)) == 2**-7
    assert float(bf16_updates.bf16_ulp(1.5)) == 2**-7 and float(bf16_updates.bf16_ulp(2.0)) == 2**-6
    assert float(bf16_updates.bf16_ulp(0.02)) == 2**-13  # 0.02 lies in [2^-6, 2^-5)
    assert not bf16_updates.update_survives(1.0, 1e-4)  # 1e-4 < 2^-8: rounded away in bf16
    assert bf16_updates.update_survives(1.0, 1e-4, torch.float32)  # kept in fp32
    assert not bf16_updates.update_survives(1.0, 2**-8)  # exactly half an ulp: ties to even (1.0)
    assert bf16_updates.update_survives(1.0, 2**-8 + 2**-12)
    # prediction: |w| = 1 freezes, |w| = 1e-3 (ulp 2^-17 ≈ 7.6e-6) moves with a step of 1e-4
    assert bf16_updates.predicted_lost_fraction(torch.tensor([1.0, -1.0, 1e-3, 2e-3]), 1e-4) == 0.5


def test_p23_pure_bf16_freezes_weights_and_fp32_masters_do_not(qwen):
    model, tokenizer = qwen
    batch = bf16_updates.sft_batch_for(tokenizer, n=16)
    bug = bf16_updates.adam_steps(copy.deepcopy(model), batch, precision="bf16", lr=1e-5, steps=2)
    fix = bf16_updates.adam_steps(copy.deepcopy(model), batch, precision="bf16-mixed", lr=1e-5, steps=2)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert bug["frozen_fraction"] > 0.8 and fix["frozen_fraction"] < 1e-3
    assert bug["frozen_fraction_by_kind"]["gains and biases"] > 0.9  # norm gains ≈ 1 never move
    assert abs(bug["frozen_fraction"] - bf16_updates.predicted_lost_fraction(weights, 1e-5)) < 0.05
    assert bf16_updates.verdict(bug["frozen_fraction"], fix["frozen_fraction"]) == (True, True)


def test_p23_verdict_false_on_bug_absent_numbers():
    assert bf16_updates.verdict(0.0, 0.0) == (False, True)  # nothing frozen: no bug to see
    assert bf16_updates.verdict(0.9, 0.4) == (True, False)  # masters that still freeze: not fixed


def test_p23_bad_precision_is_a_clear_error(qwen):
    model, tokenizer = qwen
    with pytest.raises(ValueError, match="bf16-mixed"):
        batch = bf16_updates.sft_batch_for(tokenizer, n=4)
        bf16_updates.adam_steps(copy.deepcopy(model), batch, precision="fp8", lr=1e-5, steps=1)
