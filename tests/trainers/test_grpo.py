import pytest
import torch
from helpers import assert_reward_rises

from workbench.core import losses
from workbench.core.errors import ConfigError
from workbench.experiments.checkpoints import load
from workbench.pitfalls.nb05_grpo_loss_normalization import (
    analytic_token_weights,
    effective_kl_coefficient,
    measured_token_weights,
    zero_loss_probe,
)
from workbench.tasks import rl_problems
from workbench.trainers.grpo import GRPOConfig, GRPOTrainer, grpo_loss


def probe():
    model, tokenizer = load("tiny-arith-qwen2")
    return zero_loss_probe(model, tokenizer, "12+34=", ["46", "4", "4612", "-1"], [1.0, 0.0, 0.0, 0.0])


def test_s5_bug_token_mean_probe_loss_is_not_zero_with_unequal_lengths():
    result = probe()
    assert abs(result["token-mean"]["loss"]) > 1e-2


def test_s5_fix_seq_mean_token_mean_probe_loss_is_zero_but_the_gradient_is_not():
    result = probe()
    assert abs(result["seq-mean-token-mean"]["loss"]) <= 1e-7
    assert result["seq-mean-token-mean"]["grad_norm"] > 1e-2


@pytest.mark.parametrize("mode", losses.LOSS_AGG_MODES + tuple(losses.LOSS_AGG_ALIASES))
def test_token_weights_analytic_equal_autograd(mode):
    lengths = [1, 3, 7, 0]
    assert analytic_token_weights(lengths, mode) == pytest.approx(measured_token_weights(lengths, mode), abs=1e-7)


def test_per_sequence_kl_makes_beta_depend_on_length():
    short, long = effective_kl_coefficient([2, 8], 0.1, "token-mean")
    assert short == pytest.approx(0.1 * 5 / 2) and long == pytest.approx(0.1 * 5 / 8)
    assert effective_kl_coefficient([2, 8], 0.1, "seq-mean-token-mean") == pytest.approx([0.1, 0.1])


def test_kl_aggregation_switch_differs_only_when_normalisations_differ():
    torch.manual_seed(0)
    logp = torch.randn(2, 5)
    ref = logp + 0.3 * torch.randn(2, 5)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    kw = dict(ref_logp=ref, beta=0.1)
    fixed, _ = grpo_loss(logp, logp, adv, mask, loss_agg="token-mean", kl_aggregation="with_loss", **kw)
    mixed, _ = grpo_loss(logp, logp, adv, mask, loss_agg="token-mean", kl_aggregation="per_sequence", **kw)
    kl = losses.kl_penalty(logp, ref, "k3") * mask
    token_mean_kl = kl.sum() / 7
    per_sequence_kl = (kl[0].sum() / 2 + kl[1].sum() / 5) / 2
    assert float(fixed - mixed) == pytest.approx(0.1 * float(token_mean_kl - per_sequence_kl), abs=1e-7)
    assert abs(float(token_mean_kl - per_sequence_kl)) > 1e-3
    same_a, _ = grpo_loss(logp, logp, adv, mask, loss_agg="grpo", kl_aggregation="with_loss", **kw)
    same_b, _ = grpo_loss(logp, logp, adv, mask, loss_agg="grpo", kl_aggregation="per_sequence", **kw)
    assert abs(float(same_a - same_b)) < 1e-6


def test_first_iteration_ratio_is_exactly_one():
    model, tokenizer = load("tiny-arith-qwen2")
    config = GRPOConfig(steps=1, progress=False, prompts_per_step=2, num_generations=4)
    step = GRPOTrainer(model, tokenizer, rl_problems(16), config).train()[0]
    assert step["clip_fraction"] == 0.0


@pytest.mark.slow  # full training / realistic checkpoints: make test-all
def test_grpo_raises_the_reward():
    model, tokenizer = load("tiny-arith-qwen2")
    config = GRPOConfig(steps=120, seed=0, progress=False)
    assert_reward_rises(GRPOTrainer(model, tokenizer, rl_problems(64), config), window=20, margin=0.05)


def test_masking_truncated_completions_removes_them_from_the_loss():
    model, tokenizer = load("tiny-arith-qwen2")
    config = GRPOConfig(steps=1, progress=False, prompts_per_step=2, num_generations=4, max_new_tokens=1,
                        mask_truncated_completions=True)
    step = GRPOTrainer(model, tokenizer, rl_problems(16), config).train()[0]
    assert step["finished_fraction"] == 0.0 and step["loss"] == 0.0 and step["grad_norm"] == 0.0


@pytest.mark.parametrize(
    "field, value, message",
    [("num_generations", 1, "num_generations=1 must be ≥ 2"), ("beta", -0.1, "beta=-0.1 must be ≥ 0"),
     ("loss_agg", "mean", "loss aggregation"), ("scale_rewards", "std", "is not one of"),
     ("mini_batches", 3, "divide prompts_per_step"), ("clip_low", 0, "clip_low=0")],
)
def test_invalid_config_values_name_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(**{field: value})


def test_resume_continues_exactly(tmp_path):
    def trainer(steps):
        model, tokenizer = load("tiny-arith-qwen2")
        config = GRPOConfig(steps=steps, progress=False, prompts_per_step=2, num_generations=4, beta=0.05,
                            output_dir=str(tmp_path / "run"), checkpoint_every=1)
        return GRPOTrainer(model, tokenizer, rl_problems(16), config)

    reference_model, tokenizer = load("tiny-arith-qwen2")
    straight = GRPOTrainer(reference_model, tokenizer, rl_problems(16),
                           GRPOConfig(steps=3, progress=False, prompts_per_step=2, num_generations=4, beta=0.05))
    straight.train()
    trainer(2).train()
    resumed = trainer(3)
    history = resumed.train()
    assert [h["loss"] for h in history] == [h["loss"] for h in straight.history]
    for a, b in zip(straight.policy.parameters(), resumed.policy.parameters(), strict=False):
        assert torch.equal(a, b)
