"""P6–P13: each pitfall's signature with the switch on, and its absence with the switch off."""

import pytest
import torch

from workbench.core import losses
from workbench.core.batching import pad_sequences
from workbench.experiments.checkpoints import load
from workbench.modeling.dropout import disable_dropout
from workbench.modeling.perturbation import perturbed_copy
from workbench.modeling.rollout import sample
from workbench.pitfalls import nb06_temperature as temperature
from workbench.pitfalls import nb07_dropout as dropout
from workbench.pitfalls import nb08_pad_equals_eos as pad_eos
from workbench.pitfalls import nb09_kl_estimators as kl_estimators
from workbench.pitfalls import nb10_grad_accumulation as grad_accumulation
from workbench.pitfalls import nb12_logprob_mismatch as rollout_mismatch
from workbench.pitfalls import nb13_whitening as whitening
from workbench.tasks import TEST_PROMPTS, TRAIN_PROMPTS, encode_prompts, load_problems, rl_problems
from workbench.trainers.grpo import GRPOConfig, GRPOTrainer
from workbench.trainers.ppo import PPOConfig, PPOTrainer

PROMPTS = [p.prompt for p in rl_problems(32)]


@pytest.fixture(scope="module")
def qwen():
    return load("tiny-arith-qwen2")


# ---- P6 temperature ---------------------------------------------------------------------------
def test_p6_temperature_bug_and_fix(qwen):
    model, tokenizer = qwen
    bug = temperature.first_step_ratio(model, tokenizer, PROMPTS, temperature=0.7, rescale=False)
    fix = temperature.first_step_ratio(model, tokenizer, PROMPTS, temperature=0.7, rescale=True)
    assert bug["max_ratio_deviation"] > 0.1 and fix["max_ratio_deviation"] < 1e-4


def test_p6_ppo_switch():
    runs = {}
    for rescale in (False, True):
        model, tokenizer = load("tiny-arith-qwen2")
        config = PPOConfig(steps=1, temperature=0.7, rescale_by_temperature=rescale, progress=False, prompts_per_step=8, mini_batches=1)
        runs[rescale] = PPOTrainer(model, tokenizer, rl_problems(16), config).train()[0]
    assert runs[False]["first_ratio_deviation"] > 0.1 and runs[True]["first_ratio_deviation"] < 1e-4


# ---- P7 dropout --------------------------------------------------------------------------------
def test_p7_dropout_bug_and_fix():
    model, tokenizer = load("tiny-arith-gpt2")
    bug = dropout.step0_mismatch(model, tokenizer, PROMPTS, dropout=0.1, disable=False)
    fix = dropout.step0_mismatch(model, tokenizer, PROMPTS, dropout=0.1, disable=True)
    assert bug["max_ratio_deviation"] > 0.1 and abs(bug["sequence_kl_k1"]) > 0.01
    assert fix["max_ratio_deviation"] < 1e-4 and abs(fix["sequence_kl_k1"]) < 1e-4


def test_p7_disable_dropout_switches_every_site_off():
    model, _ = load("tiny-arith-gpt2")
    dropout.set_dropout(model, 0.2)
    assert disable_dropout(model) > 0
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))


def test_p7_ppo_switch():
    runs = {}
    for disable in (False, True):
        model, tokenizer = load("tiny-arith-gpt2")
        dropout.set_dropout(model, 0.1)
        config = PPOConfig(steps=1, disable_dropout=disable, progress=False, prompts_per_step=8, mini_batches=1)
        runs[disable] = PPOTrainer(model, tokenizer, rl_problems(16), config).train()[0]
    assert runs[False]["train_ratio_deviation"] > 0.1 and runs[True]["train_ratio_deviation"] < 1e-4


# ---- P8 pad = EOS ------------------------------------------------------------------------------
def test_p8_pad_equals_eos_never_learns_to_stop():
    problems, test = load_problems(TRAIN_PROMPTS), load_problems(TEST_PROMPTS)[:32]
    stats = {}
    for bug in (False, True):
        model, tokenizer, _ = pad_eos.sft_run(problems, pad_equals_eos=bug, steps=60)
        stats[bug] = pad_eos.stopping_stats(model, tokenizer, test)
    assert stats[True]["finished_fraction"] == 0.0 and stats[True]["mean_length"] == 16
    assert stats[False]["finished_fraction"] > 0.9


# ---- P9 KL estimators --------------------------------------------------------------------------
def test_p9_estimator_values_and_gradients(qwen):
    reference, tokenizer = qwen
    policy = perturbed_copy(reference, 0.02, seed=0)
    generator = torch.Generator().manual_seed(0)
    ids, mask = encode_prompts(tokenizer, PROMPTS[:8])
    rollout = sample(policy, ids, mask, max_new_tokens=4, eos_token_id=2, pad_token_id=0, generator=generator)
    seq, seq_mask = rollout.sequences()
    positions = torch.nonzero(rollout.response_mask.bool())
    positions[:, 1] += ids.shape[1] - 1
    values = kl_estimators.value_stats(policy, reference, seq, seq_mask, positions)
    assert abs(values["k1"]["bias"]) < 1e-5 and abs(values["k3"]["bias"]) < 1e-5 and values["k2"]["bias"] > 1e-3
    grads = kl_estimators.gradient_comparison(policy, reference, seq, seq_mask, positions)
    assert grads["k1 in loss"]["norm_ratio"] < 1e-4  # the bug: no gradient at all
    assert grads["k2 in loss"]["cosine"] > 0.999 and grads["k1 in reward"]["cosine"] > 0.999
    assert grads["k3 in loss"]["cosine"] < 0.999  # a different objective (forward KL)


# ---- P10 gradient accumulation ----------------------------------------------------------------
def test_p10_accumulation_bug_and_fix(qwen):
    model, tokenizer = qwen
    rows = [[1] + [5] * n for n in (2, 2, 3, 3, 20, 24, 30, 31)]
    ids, mask = pad_sequences(rows, 0, side="right")
    advantages = torch.tensor([1.0, -1.0] * 4)
    full = grad_accumulation.full_batch_gradient(model, ids, mask, advantages)
    bug = grad_accumulation.accumulated_gradient(model, ids, mask, advantages, micro_batches=4, normalization="per_micro_batch")
    fix = grad_accumulation.accumulated_gradient(model, ids, mask, advantages, micro_batches=4, normalization="global")
    assert grad_accumulation.relative_error(bug, full) > 0.1
    assert grad_accumulation.relative_error(fix, full) < 1e-5


# ---- P11 truncated responses -------------------------------------------------------------------
def test_p11_truncated_responses_rewarded_only_under_the_bug():
    runs = {}
    for bug in (True, False):
        model, tokenizer = load("tiny-arith-qwen2")
        config = GRPOConfig(steps=3, max_new_tokens=3, score_truncated_as_finished=bug, progress=False)
        runs[bug] = sum(h["truncated_rewarded"] for h in GRPOTrainer(model, tokenizer, rl_problems(64), config).train())
    assert runs[True] > 0 and runs[False] == 0


# ---- P12 rollout / trainer mismatch -----------------------------------------------------------
def test_p12_bf16_rollout_mismatch_and_tis(qwen):
    model, tokenizer = qwen
    bf16 = rollout_mismatch.rollout_vs_trainer(model, tokenizer, PROMPTS, rollout_dtype=torch.bfloat16, cap=1.05)
    fp32 = rollout_mismatch.rollout_vs_trainer(model, tokenizer, PROMPTS, rollout_dtype=torch.float32)
    assert bf16["max_ratio_deviation"] > 1e-2 and fp32["max_ratio_deviation"] < 1e-4
    assert bf16["tis_max_weight"] <= 1.05
    torch.testing.assert_close(losses.tis_weights(torch.tensor([0.0, 1.0]), torch.tensor([0.0, 0.0]), 2.0), torch.tensor([1.0, 2.0]))


def test_p12_ppo_tis_needs_recomputed_old_logprobs():
    from workbench.core.errors import ConfigError

    with pytest.raises(ConfigError, match="recompute"):
        PPOConfig(tis_cap=2.0, old_logprobs="rollout")
    model, tokenizer = load("tiny-arith-qwen2")
    config = PPOConfig(steps=1, rollout_dtype="bfloat16", old_logprobs="recompute", tis_cap=2.0, progress=False,
                       prompts_per_step=8, mini_batches=1)
    step = PPOTrainer(model, tokenizer, rl_problems(16), config).train()[0]
    assert step["first_ratio_deviation"] > 1e-3 and step["train_ratio_deviation"] < 1e-4


# ---- P13 whitening ------------------------------------------------------------------------------
def test_p13_whitening_over_padding_is_polluted():
    values = torch.tensor([[1.0, 2.0, 3.0, 0.0, 0.0], [4.0, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    naive = whitening.real_token_stats(losses.naive_whiten(values) * mask, mask)
    masked = whitening.real_token_stats(losses.masked_whiten(values, mask), mask)
    assert abs(naive["mean"]) > 0.5
    assert abs(masked["mean"]) < 1e-6 and masked["std"] == pytest.approx(1.0, abs=1e-4)
    rows = whitening.whitening_vs_padding(values, mask, [0, 10])
    assert abs(rows[1]["naive_mean"]) > abs(rows[0]["naive_mean"])  # more padding, worse
    assert rows[1]["masked_mean"] == pytest.approx(rows[0]["masked_mean"], abs=1e-6)


def test_p13_ppo_switch():
    runs = {}
    for over in ("padded", "real"):
        model, tokenizer = load("tiny-arith-qwen2")
        config = PPOConfig(steps=1, whiten_over=over, progress=False, prompts_per_step=16, mini_batches=1)
        runs[over] = PPOTrainer(model, tokenizer, rl_problems(32), config).train()[0]
    assert abs(runs["padded"]["advantage_mean_real_tokens"]) > 1e-2
    assert abs(runs["real"]["advantage_mean_real_tokens"]) < 1e-6
