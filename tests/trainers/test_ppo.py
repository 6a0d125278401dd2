import math

import pytest
import torch
from helpers import assert_reward_rises

from workbench.core.errors import ConfigError
from workbench.experiments.checkpoints import load
from workbench.tasks import Problem, rl_problems
from workbench.trainers.ppo import PPOConfig, PPOTrainer, last_token_rewards

# Prompts of different lengths, so a left-padded batch really has pads.
RAGGED = [Problem("1+2=", "3"), Problem("12+34=", "46"), Problem("3*4=", "12"), Problem("56-7=", "49"),
          Problem("9-99=", "-90"), Problem("7+8=", "15"), Problem("80-80=", "0"), Problem("2*2=", "4")]


def one_step(name, **overrides):
    model, tokenizer = load(name)
    config = PPOConfig(steps=1, progress=False, prompts_per_step=8, mini_batches=2, **overrides)
    return PPOTrainer(model, tokenizer, RAGGED, config).train()[0]


def test_s1_bug_gpt2_ratio_and_kl_at_step0_are_not_one_and_zero():
    # π_old from the sampler (which derives positions from the mask, as generate does): the
    # training forward disagrees with it, so ρ ≠ 1 and the KL to an identical reference ≠ 0
    bug = one_step("tiny-arith-gpt2", position_ids="model", old_logprobs="rollout")
    assert bug["first_ratio_deviation"] > 0.1
    assert bug["first_logp_gap"] >= math.log1p(bug["first_ratio_deviation"]) - 1e-4  # |Δ log p| ≥ log(1 + |ρ − 1|)
    assert bug["train_ratio_deviation"] > 0.1
    assert bug["kl_token_max_abs"] > 0.01


def test_s1_bug_with_recomputed_old_logprobs_is_self_consistent_but_disagrees_with_the_sampler():
    # recomputing π_old with the same (buggy) forward hides the bug from ρ and the KL; the
    # sampler/trainer gap still shows it
    bug = one_step("tiny-arith-gpt2", position_ids="model")
    assert bug["first_ratio_deviation"] > 0.1
    assert bug["train_ratio_deviation"] == 0.0
    assert bug["kl_token_max_abs"] == 0.0


def test_s1_fix_gpt2_ratio_is_one_and_kl_zero_at_step0():
    fix = one_step("tiny-arith-gpt2", position_ids="mask")
    assert fix["first_ratio_deviation"] < 1e-4
    assert fix["first_logp_gap"] < 1e-4
    assert fix["kl_token_max_abs"] < 1e-4


def test_s1_rope_model_shows_only_float_noise_even_with_the_bug():
    bug = one_step("tiny-arith-qwen2", position_ids="model")
    assert bug["first_ratio_deviation"] < 1e-3


def test_s3_bug_decodes_the_full_budget_and_the_fix_learns_the_same():
    bug = one_step("tiny-arith-qwen2", stop_at_eos=False, max_new_tokens=16)
    fix = one_step("tiny-arith-qwen2", stop_at_eos=True, max_new_tokens=16)
    assert bug["decode_steps"] == 16 and bug["tokens_generated"] == 8 * 16
    assert fix["decode_steps"] < 16 and fix["tokens_generated"] < bug["tokens_generated"]
    assert bug["tokens_needed"] == fix["tokens_needed"]
    for key in ("reward", "policy_loss", "value_loss", "kl"):
        assert abs(bug[key] - fix[key]) <= 1e-6, key


def test_missing_eos_penalty_applies_only_to_truncated_responses():
    step = one_step("tiny-arith-qwen2", max_new_tokens=1, missing_eos_penalty=0.7)
    # one token cannot hold an answer and its EOS: every response is truncated
    assert step["finished_fraction"] < 1.0
    assert step["score_with_penalty"] == pytest.approx(step["reward"] - 0.7 * (1 - step["finished_fraction"]))


def test_last_token_rewards_puts_the_score_on_the_last_real_token():
    rewards = last_token_rewards(torch.tensor([1.0, 2.0]), torch.tensor([[1, 1, 0], [1, 1, 1]]))
    assert rewards.tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 2.0]]


@pytest.mark.slow  # full training / realistic checkpoints: make test-all
def test_ppo_raises_the_reward():
    model, tokenizer = load("tiny-arith-qwen2")
    config = PPOConfig(steps=60, seed=0, progress=False)
    assert_reward_rises(PPOTrainer(model, tokenizer, rl_problems(64), config), window=15, margin=0.08)


@pytest.mark.parametrize(
    "field, value, message",
    [("kl_coef", -0.1, "kl_coef=-0.1 must be ≥ 0"), ("clip_low", 0.0, "clip_low=0.0 must be in"),
     ("kl_kind", "k9", "is not one of"), ("mini_batches", 3, "mini_batches"),
     ("position_ids", "none", "position_ids"), ("loss_agg", "mean", "loss aggregation")],
)
def test_invalid_config_values_name_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        PPOConfig(**{field: value})


def test_resume_continues_exactly(tmp_path):
    def trainer(out, steps):
        model, tokenizer = load("tiny-arith-qwen2")
        config = PPOConfig(steps=steps, progress=False, prompts_per_step=8, mini_batches=2, output_dir=str(out))
        return PPOTrainer(model, tokenizer, RAGGED, config)

    straight = trainer(tmp_path / "a", 4)
    straight.train()
    first = trainer(tmp_path / "b", 2)
    first.train()
    resumed = trainer(tmp_path / "b", 4)
    history = resumed.train()
    assert [h["reward"] for h in history] == [h["reward"] for h in straight.history]
    assert [h["policy_loss"] for h in history] == [h["policy_loss"] for h in straight.history]
    for a, b in zip(straight.policy.parameters(), resumed.policy.parameters(), strict=False):
        assert torch.equal(a, b)
    for a, b in zip(straight.critic.parameters(), resumed.critic.parameters(), strict=False):
        assert torch.equal(a, b)
