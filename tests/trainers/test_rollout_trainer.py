"""The rollout–training gap options PPO and GRPO share: ``sampler_precision``, ``rollout_staleness`` and
``rollout_correction`` (``core.rollout_correction``), their ``rollout_corr/`` metrics and their checks."""

import math

import pytest
import torch

from workbench.core.errors import ConfigError
from workbench.experiments.checkpoints import load
from workbench.tasks import rl_problems
from workbench.trainers.grpo import GRPOConfig, GRPOTrainer
from workbench.trainers.ppo import PPOConfig, PPOTrainer

SMALL_GRPO = {"progress": False, "prompts_per_step": 2, "num_generations": 4, "max_new_tokens": 4}


def grpo_history(steps=1, **options):
    model, tokenizer = load("tiny-arith-qwen2")
    return GRPOTrainer(model, tokenizer, rl_problems(16), GRPOConfig(steps=steps, **SMALL_GRPO, **options)).train()


def test_no_gap_no_metrics_and_a_neutral_correction_changes_nothing():
    plain = grpo_history()[0]
    assert not any(k.startswith("rollout_corr/") for k in plain)
    neutral = grpo_history(rollout_correction={"rollout_is": "token", "rollout_is_threshold": 1e9})[0]
    assert abs(neutral["rollout_corr/kl"]) < 1e-6  # the fp32 sampler is the policy: float noise only
    assert abs(neutral["rollout_corr/rollout_is_mean"] - 1) < 1e-5
    assert abs(neutral["loss"] - plain["loss"]) < 1e-5


def test_a_bf16_sampler_opens_a_gap_that_the_metrics_show():
    step = grpo_history(sampler_precision="bf16", rollout_correction="decoupled_seq_is_rs")[0]
    assert step["rollout_corr/k3_kl"] > 1e-6
    assert 0 <= step["rollout_corr/rollout_rs_masked_fraction"] <= 1
    assert math.isfinite(step["loss"])


def test_stale_rollouts_come_from_older_weights():
    history = grpo_history(steps=2, rollout_staleness=1, learning_rate=1e-2)
    assert abs(history[0]["rollout_corr/kl"]) < 1e-6  # step 0: the initial weights are the current ones
    assert abs(history[1]["rollout_corr/kl"]) > 1e-4  # step 1: sampled by the weights before the first update


def test_trl_settings_and_the_off_policy_mask_run_in_grpo():
    step = grpo_history(sampler_precision="bf16", rollout_correction={
        "vllm_importance_sampling_mode": "token_truncate", "off_policy_mask_threshold": 0.0})[0]
    assert {"sampling/importance_sampling_ratio/mean", "rollout_corr/kl"} <= set(step)
    assert math.isfinite(step["loss"])


def test_ppo_logs_and_applies_the_correction():
    model, tokenizer = load("tiny-arith-qwen2")
    config = PPOConfig(steps=1, progress=False, prompts_per_step=4, mini_batches=2, ppo_epochs=1, max_new_tokens=4,
                       sampler_precision="bf16", rollout_correction={"rollout_is": "token", "rollout_rs": "token_k1",
                                                                     "rollout_rs_threshold": 2.0})
    step = PPOTrainer(model, tokenizer, rl_problems(16), config).train()[0]
    assert step["rollout_corr/k3_kl"] > 1e-6 and "rollout_corr/rollout_is_eff_sample_size" in step
    assert math.isfinite(step["policy_loss"])


@pytest.mark.parametrize(("config_class", "options", "field", "words"), [
    (GRPOConfig, {"rollout_correction": "tis"}, "rollout_correction", "unknown preset"),
    (GRPOConfig, {"rollout_correction": {"rollout_rs": "seq_mean_k1"}}, "rollout_correction", "required"),
    (GRPOConfig, {"sampler_precision": "int8"}, "sampler_precision", "is not one of"),
    (GRPOConfig, {"rollout_staleness": -1}, "rollout_staleness", "≥ 0"),
    (PPOConfig, {"rollout_correction": "decoupled_token_is", "tis_cap": 2.0, "old_logprobs": "recompute"},
     "rollout_correction", "set one"),
    (PPOConfig, {"rollout_correction": {"off_policy_mask_threshold": 0.1}}, "rollout_correction", "GRPO only"),
])
def test_bad_gap_options_name_the_field(config_class, options, field, words):
    with pytest.raises(ConfigError, match=words) as error:
        config_class(**options)
    assert error.value.field == field


def test_rollout_dtype_is_gone_and_the_command_line_names_sampler_precision():
    """PPO's older ``rollout_dtype`` was the same knob as ``sampler_precision``: only the latter is left."""
    from workbench.cli.train import build_config
    from workbench.core.errors import InputError

    with pytest.raises(TypeError, match="rollout_dtype"):
        PPOConfig(rollout_dtype="bfloat16")
    with pytest.raises(InputError, match="no field 'rollout_dtype'.*sampler_precision"):
        build_config(PPOConfig, ["rollout_dtype=bfloat16"], None)


def weights_of(model) -> dict:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


@pytest.mark.parametrize(("config_class", "trainer_class", "options", "lag", "steps"), [
    (GRPOConfig, GRPOTrainer, {**SMALL_GRPO, "mini_batches": 2, "num_iterations": 2}, 3, 3),  # 4 updates per step
    pytest.param(PPOConfig, PPOTrainer, {"progress": False, "prompts_per_step": 2, "max_new_tokens": 4, "mini_batches": 1,
                                         "ppo_epochs": 2}, 1, 2, marks=pytest.mark.slow),  # 2 updates per step
])
def test_staleness_counts_optimiser_updates_not_steps(config_class, trainer_class, options, lag, steps):
    """``rollout_staleness=k``: the rollout of every step is sampled by the weights the policy had k optimiser updates
    before it (the initial ones while fewer were made), however many updates a step makes."""
    model, tokenizer = load("tiny-arith-qwen2")
    config = config_class(steps=steps, rollout_staleness=lag, learning_rate=1e-2, **options)
    trainer = trainer_class(model, tokenizer, rl_problems(16), config)
    after_updates = [weights_of(model)]  # the policy's weights after 0, 1, 2, … updates
    trainer.policy_optimizer_for_staleness().register_step_post_hook(lambda *args: after_updates.append(weights_of(model)))
    sampled_by, original = [], trainer.sample_rollout

    def spy(step, **kwargs):
        sampled_by.append((len(after_updates) - 1, weights_of(kwargs["sampler"])))
        versions.append((step, trainer.policy_version(step)))
        return original(step, **kwargs)

    versions = []

    trainer.sample_rollout = spy
    trainer.train()
    per_step = len(after_updates[1:]) // steps
    assert per_step == (4 if config_class is GRPOConfig else 2)
    for updates, weights in sampled_by:
        expected = after_updates[max(updates - lag, 0)]
        assert all(torch.equal(weights[name], expected[name]) for name in expected), (updates, lag)
    assert sampled_by[-1][0] - lag > 0 and sampled_by[-1][0] - lag < per_step * (steps - 1)  # not a whole number of steps
    # a dump's policy_version is a step: the steps whose updates the sampler's weights lack, ⌈k / u⌉ once k were made
    assert versions == [(step, step - -(-min(updates, lag) // per_step)) for step, (updates, _) in enumerate(sampled_by)]
