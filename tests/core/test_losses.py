"""Every loss function against values computed by hand (pencil-and-paper numbers in comments)."""

import math

import pytest
import torch

from workbench.core import losses

pytestmark = pytest.mark.numeric  # held to AVX2 in .ci/run (docs/CPU_PORTABILITY.md)

T = torch.tensor


def close(a, b, tol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32), atol=tol, rtol=0)


# ---- masked statistics ------------------------------------------------------------------------
def test_masked_mean_and_var_ignore_masked_positions():
    x, m = T([[1.0, 2.0, 100.0], [3.0, -50.0, 4.0]]), T([[1, 1, 0], [1, 0, 1]])
    close(losses.masked_mean(x, m), 2.5)  # (1+2+3+4)/4
    close(losses.masked_var(x, m), 5 / 3)  # squared deviations 2.25+.25+.25+2.25 = 5, / (4−1)
    close(losses.masked_var(x, m, unbiased=False), 1.25)
    close(losses.masked_mean(x, torch.zeros_like(m)), 0.0)  # empty mask: 0, not NaN


def test_masked_whiten_uses_real_tokens_only():
    x, m = T([[1.0, 2.0, 100.0], [3.0, -50.0, 4.0]]), T([[1, 1, 0], [1, 0, 1]])
    w = losses.masked_whiten(x, m)
    std = math.sqrt(5 / 3)
    close(w, T([[-1.5 / std, -0.5 / std, 0.0], [0.5 / std, 0.0, 1.5 / std]]), 1e-5)
    kept = losses.masked_whiten(x, m, shift_mean=False)
    close(kept[0, 0], (1 - 2.5) / std + 2.5, 1e-5)


# ---- KL estimators ----------------------------------------------------------------------------
def test_kl_estimators_by_hand():
    logp, ref = T([-1.0, -2.0]), T([-1.5, -1.0])  # r = +0.5, −1.0
    close(losses.kl_penalty(logp, ref, "k1"), T([0.5, -1.0]))
    close(losses.kl_penalty(logp, ref, "k2"), T([0.125, 0.5]))
    close(losses.kl_penalty(logp, ref, "k3"), T([math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0]))
    close(losses.kl_penalty(T([0.0]), T([-20.0]), "low_var_kl"), T([10.0]))  # exp(−20)−1+20 ≈ 19 → clamped
    with pytest.raises(ValueError, match="k1"):
        losses.kl_penalty(logp, ref, "k4")


# ---- GAE --------------------------------------------------------------------------------------
def test_gae_by_hand_with_padding():
    # one response of 2 real tokens + 1 pad; γ = 0.9, λ = 0.5
    rewards, values, mask = T([[0.0, 1.0, 7.0]]), T([[0.5, 0.2, 9.0]]), T([[1, 1, 0]])
    adv, ret = losses.gae(rewards, values, mask, gamma=0.9, lam=0.5)
    delta1 = 1.0 - 0.2  # last real token: no bootstrap from the pad
    delta0 = 0.0 + 0.9 * 0.2 - 0.5
    a1, a0 = delta1, delta0 + 0.9 * 0.5 * delta1
    close(adv, T([[a0, a1, 0.0]]))
    close(ret, T([[a0 + 0.5, a1 + 0.2, 0.0]]))


def test_gae_with_gamma_lambda_one_is_reward_to_go_minus_value():
    rewards, values, mask = T([[0.1, 0.2, 0.3]]), T([[1.0, 2.0, 3.0]]), T([[1, 1, 1]])
    adv, _ = losses.gae(rewards, values, mask, gamma=1.0, lam=1.0)
    close(adv, T([[0.6 - 1.0, 0.5 - 2.0, 0.3 - 3.0]]))


# ---- PPO policy and value losses -------------------------------------------------------------
def test_ppo_policy_loss_by_hand():
    # ratios 1.5 (A=+1 → clipped at 1.2), 0.5 (A=−1 → clipped at 0.8), 1.1 (A=+2, inside)
    logp = torch.log(T([[1.5, 0.5, 1.1]]))
    old = torch.zeros(1, 3)
    adv = T([[1.0, -1.0, 2.0]])
    loss, stats = losses.ppo_policy_loss(logp, old, adv, torch.ones(1, 3), clip_low=0.2, clip_high=0.2)
    close(loss, (-1.2 + 0.8 - 2.2) / 3)
    assert stats["clip_fraction"] == pytest.approx(2 / 3)
    # asymmetric clip (DAPO clip-higher): ε_high = 0.6 leaves 1.5 unclipped
    loss, _ = losses.ppo_policy_loss(logp, old, adv, torch.ones(1, 3), clip_low=0.2, clip_high=0.6)
    close(loss, (-1.5 + 0.8 - 2.2) / 3)


def test_ppo_value_loss_by_hand():
    values, old, returns = T([[1.0, 0.0]]), T([[0.5, 0.0]]), T([[2.0, 1.0]])
    loss, clipfrac = losses.ppo_value_loss(values, old, returns, T([[1, 1]]), clip=0.2)
    # token 0: unclipped (1−2)² = 1, clipped V = 0.7 → (0.7−2)² = 1.69; token 1: 1, 1
    close(loss, 0.5 * (1.69 + 1.0) / 2)
    assert clipfrac == pytest.approx(0.5)


# ---- loss aggregation (S5) -------------------------------------------------------------------
LOSS = T([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0]])
MASK = T([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])  # lengths 4, 2, 0 (an empty row)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 40 / 6),
        ("bnpo", 40 / 6),
        ("dapo", 40 / 6),
        # verl 0.9.1 names: the empty row is left out of the count of sequences
        ("seq-mean-token-mean", (10 / 4 + 30 / 2) / 2),
        ("seq-mean-token-sum", (10 + 30) / 2),
        ("seq-mean-token-sum-norm", 40 / (2 * 4)),
        # TRL 1.16 aliases: the empty row counts as a sequence with loss 0
        ("grpo", (10 / 4 + 30 / 2 + 0) / 3),
        ("dr_grpo", 40 / (3 * 4)),
    ],
)
def test_aggregate_loss_by_hand(mode, expected):
    close(losses.aggregate_loss(LOSS, MASK, mode), expected)


def test_aggregate_loss_max_len_and_errors_and_empty_batch():
    close(losses.aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", max_len=10), 40 / 20)  # 2 non-empty rows
    close(losses.aggregate_loss(LOSS, MASK, "dr_grpo", max_len=10), 40 / 30)  # TRL: B × max_len
    for mode in losses.LOSS_AGG_MODES + tuple(losses.LOSS_AGG_ALIASES):
        value = losses.aggregate_loss(LOSS, torch.zeros_like(MASK), mode)
        assert torch.isfinite(value) and value == 0
    with pytest.raises(ValueError, match="token-mean.*dr_grpo"):
        losses.aggregate_loss(LOSS, MASK, "sequence-mean")


def test_zero_loss_probe_global_vs_per_sequence():
    """S5 probe: β=0, ρ=1 → per-token loss −A_i; group advantages sum to 0."""
    rewards = T([1.0, 0.0])
    adv = losses.group_advantages(rewards, 2, "none")  # +0.5, −0.5
    mask = T([[1, 0, 0, 0], [1, 1, 1, 1]])  # lengths 1 and 4
    per_token = -adv[:, None].expand(2, 4)
    close(losses.aggregate_loss(per_token, mask, "seq-mean-token-mean"), 0.0)
    close(losses.aggregate_loss(per_token, mask, "token-mean"), -(0.5 * 1 - 0.5 * 4) / 5)  # = +0.3


# ---- group advantages ------------------------------------------------------------------------
def test_group_advantages_by_hand():
    rewards = T([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])  # two groups of 3
    g1_mean, g1_std = 1 / 3, math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)
    g2_mean, g2_std = 2 / 3, g1_std
    eps = 1e-4
    group = losses.group_advantages(rewards, 3, "group", eps)
    close(group[:3], (T([1.0, 0.0, 0.0]) - g1_mean) / (g1_std + eps), 1e-5)
    close(group[3:], (T([0.0, 1.0, 1.0]) - g2_mean) / (g2_std + eps), 1e-5)
    none = losses.group_advantages(rewards, 3, "none")
    close(none, T([2 / 3, -1 / 3, -1 / 3, -2 / 3, 1 / 3, 1 / 3]))
    batch = losses.group_advantages(rewards, 3, "batch", eps)
    close(batch, none / (rewards.std() + eps), 1e-5)
    close(losses.group_advantages(T([1.0, 1.0]), 2, "group"), T([0.0, 0.0]))  # equal rewards: 0, not NaN
    with pytest.raises(ValueError, match="do not split"):
        losses.group_advantages(rewards, 4)
    with pytest.raises(ValueError, match="≥ 2"):
        losses.group_advantages(rewards, 1)


# ---- DPO --------------------------------------------------------------------------------------
def test_dpo_losses_by_hand():
    pc, pr, rc, rr = T([-1.0]), T([-3.0]), T([-2.0]), T([-2.5])
    beta = 0.5
    h = (-1.0 + 2.0) - (-3.0 + 2.5)  # 1.5
    losses_, chosen, rejected = losses.dpo_loss(pc, pr, rc, rr, beta, "sigmoid")
    close(losses_, T([math.log(1 + math.exp(-beta * h))]))
    close(chosen, T([0.5 * 1.0])), close(rejected, T([0.5 * -0.5]))
    smoothed, _, _ = losses.dpo_loss(pc, pr, rc, rr, beta, "sigmoid", label_smoothing=0.1)
    close(smoothed, T([0.9 * math.log(1 + math.exp(-0.75)) + 0.1 * math.log(1 + math.exp(0.75))]))
    ipo_sum, _, _ = losses.dpo_loss(pc, pr, rc, rr, beta, "ipo_sum")  # OpenRLHF: summed log-ratios
    close(ipo_sum, T([(1.5 - 1 / (2 * beta)) ** 2]))
    # TRL 1.16 ipo: chosen log-ratio 1.0 over 4 tokens, rejected −0.5 over 2 → 0.25 + 0.25 = 0.5
    ipo, _, _ = losses.dpo_loss(pc, pr, rc, rr, beta, "ipo", chosen_lengths=T([4]), rejected_lengths=T([2]))
    close(ipo, T([(0.5 - 1 / (2 * beta)) ** 2]))
    with pytest.raises(ValueError, match="chosen_lengths"):
        losses.dpo_loss(pc, pr, rc, rr, beta, "ipo")
    # TRL 1.16 robust, ε = 0.1: [0.9·softplus(−0.75) − 0.1·softplus(0.75)] / 0.8
    robust, _, _ = losses.dpo_loss(pc, pr, rc, rr, beta, "robust", label_smoothing=0.1)
    close(robust, T([(0.9 * math.log(1 + math.exp(-0.75)) - 0.1 * math.log(1 + math.exp(0.75))) / 0.8]))
    robust0, _, _ = losses.dpo_loss(pc, pr, rc, rr, beta, "robust")
    close(robust0, losses_)  # ε = 0: robust = sigmoid
    hinge, _, _ = losses.dpo_loss(pc, pr, rc, rr, beta, "hinge")
    close(hinge, T([max(0.0, 1 - 0.75)]))
    with pytest.raises(ValueError, match="sigmoid"):
        losses.dpo_loss(pc, pr, rc, rr, beta, "kto")


def test_dpo_trainer_refuses_label_smoothing_where_no_loss_uses_it():
    from workbench.core.errors import ConfigError
    from workbench.trainers.dpo import DPOConfig

    with pytest.raises(ConfigError, match="label_smoothing"):
        DPOConfig(loss_type="ipo", label_smoothing=0.1)
    DPOConfig(loss_type="robust", label_smoothing=0.1)


# ---- masked reductions select, they do not multiply ------------------------------------------
INF_LOSS = T([[1.0, 2.0, float("inf")], [3.0, float("nan"), float("-inf")]])
INF_MASK = T([[1, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize("mode", losses.LOSS_AGG_MODES + tuple(losses.LOSS_AGG_ALIASES))
def test_inf_or_nan_at_padded_positions_never_reaches_a_reduction(mode):
    value = losses.aggregate_loss(INF_LOSS, INF_MASK, mode)
    clean = losses.aggregate_loss(torch.where(INF_MASK.bool(), INF_LOSS, 0.0), INF_MASK, mode)
    assert torch.isfinite(value) and float(value) == float(clean)
    # a multiply-by-mask reduction is NaN on the same input
    assert not torch.isfinite((INF_LOSS * INF_MASK).sum() / INF_MASK.sum())


def test_inf_at_padded_positions_other_masked_functions():
    assert torch.isfinite(losses.masked_mean(INF_LOSS, INF_MASK))
    assert torch.isfinite(losses.masked_var(INF_LOSS, INF_MASK))
    assert torch.isfinite(losses.masked_whiten(INF_LOSS, INF_MASK)).all()
    advantages, returns = losses.gae(INF_LOSS, INF_LOSS, INF_MASK)
    assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()
    close(losses.masked_sum(INF_LOSS, INF_MASK), 6.0)


def test_low_var_kl_is_k3_clamped_at_10():
    logp, ref = T([0.0, -15.0, -1.0]), T([-0.5, 0.0, -1.0])
    k3 = losses.kl_penalty(logp, ref, "k3")
    low_var = losses.kl_penalty(logp, ref, "low_var_kl")
    # r = 0.5: e^−0.5 − 1 + 0.5 = 0.10653; r = −15: e^15 − 16 ≈ 3.27e6 → clamped to 10; r = 0 → 0
    close(k3[0], math.exp(-0.5) - 0.5), close(low_var[0], math.exp(-0.5) - 0.5)
    assert float(k3[1]) == pytest.approx(math.exp(15) - 16, rel=1e-5)
    close(low_var[1], 10.0)
    close(low_var[2], 0.0)


def test_outside_clip_window_counts_ratios_beyond_epsilon():
    log_ratio = torch.log(torch.tensor([1.0, 1.1, 0.85, 1.3, 0.7]))  # |ρ − 1| = 0, 0.1, 0.15, 0.3, 0.3
    assert losses.outside_clip_window(log_ratio, 0.2) == pytest.approx(2 / 5)  # a float32 mean
    assert losses.outside_clip_window(log_ratio, 0.12) == pytest.approx(3 / 5)
    assert losses.outside_clip_window(torch.zeros(0), 0.2) == 0.0
