"""Parity with the anchors: the formulas of verl 0.9.1, TRL 1.16 and OpenRLHF 0.11.2 written out here
(read from their code, not imported) and fed the same tensors as the workbench's functions.

Sources: verl ``trainer/ppo/core_algos.py`` (``agg_loss``, ``compute_gae_advantage_return``,
``compute_grpo_outcome_advantage``, ``kl_penalty``, ``compute_policy_loss``, ``compute_value_loss``) and
``utils/torch_functional.py`` (``masked_whiten``); TRL ``grpo_trainer.py`` (``loss_type``) and
``dpo_trainer.py`` (``sigmoid``, ``robust``, ``ipo``); OpenRLHF ``models/loss.py`` (``DPOLoss``).
"""

import pytest
import torch

from workbench.core import losses

pytestmark = pytest.mark.numeric  # held to AVX2 in .ci/run (docs/CPU_PORTABILITY.md)

torch.manual_seed(0)
B, T = 5, 7
LOSS = torch.randn(B, T)
MASK = torch.tensor([[1] * 7, [1] * 3 + [0] * 4, [1] * 5 + [0] * 2, [0] * 7, [1] + [0] * 6], dtype=torch.float32)


# ---- verl 0.9.1 -----------------------------------------------------------------------------
def verl_masked_sum(values, mask):
    return (values * mask).sum()


def verl_agg_loss(loss_mat, loss_mask, mode):
    if mode == "token-mean":
        return verl_masked_sum(loss_mat, loss_mask) / loss_mask.sum()
    if mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()
        loss = verl_masked_sum(seq_losses, seq_mask) / seq_mask.sum()
        return loss / loss_mask.shape[-1] if mode == "seq-mean-token-sum-norm" else loss
    seq_count = torch.sum(loss_mask, dim=-1)
    seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_count + 1e-8)
    seq_mask = (seq_count > 0).float()
    return verl_masked_sum(seq_losses, seq_mask) / seq_mask.sum()


@pytest.mark.parametrize("mode", losses.LOSS_AGG_MODES)
def test_aggregation_matches_verl(mode):
    torch.testing.assert_close(losses.aggregate_loss(LOSS, MASK, mode), verl_agg_loss(LOSS, MASK, mode), atol=1e-6, rtol=0)


def verl_gae(rewards, values, mask, gamma, lam):
    nextvalues, lastgaelam, out = 0, 0, []
    for t in reversed(range(rewards.shape[-1])):
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * mask[:, t] + (1 - mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * mask[:, t] + (1 - mask[:, t]) * lastgaelam
        out.append(lastgaelam)
    advantages = torch.stack(out[::-1], dim=1)
    return advantages, advantages + values


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.8), (1.0, 1.0)])
def test_gae_matches_verl_on_real_tokens(gamma, lam):
    rewards, values = torch.randn(B, T), torch.randn(B, T)
    ours, our_returns = losses.gae(rewards, values, MASK, gamma, lam)
    theirs, their_returns = verl_gae(rewards, values, MASK, gamma, lam)
    real = MASK.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(our_returns[real], their_returns[real], atol=1e-5, rtol=0)


def verl_masked_whiten(values, mask):
    mean = (values * mask).sum() / mask.sum()
    centered = values - mean
    variance = (centered**2 * mask).sum() / mask.sum()
    variance = variance * mask.sum() / (mask.sum() - 1)
    return (values - mean) * torch.rsqrt(variance + 1e-8)


def test_whitening_matches_verl_on_real_tokens():
    values = torch.randn(B, T)
    real = MASK.bool()
    torch.testing.assert_close(losses.masked_whiten(values, MASK)[real], verl_masked_whiten(values, MASK)[real], atol=1e-5, rtol=0)


def verl_grpo_advantages(scores, index, epsilon=1e-6):
    out = scores.clone()
    for group in set(index):
        rows = [i for i, g in enumerate(index) if g == group]
        group_scores = scores[rows]
        mean, std = (group_scores.mean(), group_scores.std()) if len(rows) > 1 else (torch.tensor(0.0), torch.tensor(1.0))
        out[rows] = (group_scores - mean) / (std + epsilon)
    return out


def test_group_advantages_match_verl_with_its_epsilon():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.5])
    index = [i // 4 for i in range(12)]
    ours = losses.group_advantages(scores, 4, "group", eps=1e-6)
    torch.testing.assert_close(ours, verl_grpo_advantages(scores, index), atol=1e-6, rtol=0)


def verl_kl_penalty(logprob, ref_logprob, kind):
    if kind == "kl":
        return logprob - ref_logprob
    if kind == "mse":
        return 0.5 * (logprob - ref_logprob).square()
    kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


@pytest.mark.parametrize("ours, theirs", [("k1", "kl"), ("k2", "mse"), ("low_var_kl", "low_var_kl")])
def test_kl_estimators_match_verl(ours, theirs):
    logp, ref = torch.randn(B, T) * 3, torch.randn(B, T) * 3
    logp[0, 0], ref[0, 0] = 0.0, -30.0  # beyond the clamps
    logp[1, 0], ref[1, 0] = -30.0, 0.0
    torch.testing.assert_close(losses.kl_penalty(logp, ref, ours), verl_kl_penalty(logp, ref, theirs), atol=1e-4, rtol=1e-5)


def verl_policy_loss(old_log_prob, log_prob, advantages, mask, clip_low, clip_high):
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    return verl_agg_loss(torch.maximum(pg_losses1, pg_losses2), mask, "token-mean")  # dual-clip (c = 3) off


def test_clipped_policy_loss_matches_verl_without_dual_clip():
    logp, old = torch.randn(B, T) * 0.3, torch.randn(B, T) * 0.3
    advantages = torch.randn(B, T).abs()  # dual-clip only acts on negative advantages
    ours, _ = losses.ppo_policy_loss(logp, old, advantages, MASK, clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(ours, verl_policy_loss(old, logp, advantages, MASK, 0.2, 0.28), atol=1e-6, rtol=0)


def verl_value_loss(vpreds, returns, values, mask, cliprange_value):
    vpredclipped = values + torch.clamp(vpreds - values, -cliprange_value, cliprange_value)
    clipped = torch.max(torch.square(vpreds - returns), torch.square(vpredclipped - returns))
    return 0.5 * verl_agg_loss(clipped, mask, "token-mean")


def test_value_loss_matches_verl():
    vpreds, returns, values = torch.randn(B, T), torch.randn(B, T), torch.randn(B, T)
    ours, _ = losses.ppo_value_loss(vpreds, values, returns, MASK, 0.2)
    torch.testing.assert_close(ours, verl_value_loss(vpreds, returns, values, MASK, 0.2), atol=1e-6, rtol=0)


# ---- TRL 1.16 -----------------------------------------------------------------------------------
def trl_grpo_loss(per_token_loss, mask, loss_type, max_completion_length):
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type in ("bnpo", "dapo"):  # one process, one accumulation step: dapo's normaliser is the token count
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    return (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
def test_trl_aliases_match_trl_including_an_empty_row(loss_type):
    ours = losses.aggregate_loss(LOSS, MASK, loss_type, max_len=16)
    torch.testing.assert_close(ours, trl_grpo_loss(LOSS, MASK, loss_type, 16), atol=1e-6, rtol=0)


def trl_dpo_losses(chosen_scores, rejected_scores, chosen_tokens, rejected_tokens, beta, eps):
    import torch.nn.functional as F

    delta = chosen_scores - rejected_scores
    sigmoid = -F.logsigmoid(beta * delta)
    robust = (-(1 - eps) * F.logsigmoid(beta * delta) - (-eps * F.logsigmoid(-beta * delta))) / (1 - 2 * eps)
    ipo_delta = chosen_scores / chosen_tokens.clamp(min=1.0) - rejected_scores / rejected_tokens.clamp(min=1.0)
    return {"sigmoid": sigmoid, "robust": robust, "ipo": (ipo_delta - 1 / (2 * beta)) ** 2}


def openrlhf_dpo_losses(chosen_logratio, rejected_logratio, beta, eps):
    import torch.nn.functional as F

    logits = chosen_logratio - rejected_logratio
    return {"sigmoid": -F.logsigmoid(beta * logits) * (1 - eps) - F.logsigmoid(-beta * logits) * eps,
            "ipo_sum": (logits - 1 / (2 * beta)) ** 2}


def test_dpo_losses_match_trl_and_openrlhf():
    pc, pr, rc, rr = (torch.randn(6) * 5 - 20 for _ in range(4))
    n_c, n_r = torch.tensor([3.0, 1, 7, 2, 5, 4]), torch.tensor([2.0, 6, 1, 3, 3, 8])
    beta, eps = 0.3, 0.1
    trl = trl_dpo_losses(pc - rc, pr - rr, n_c, n_r, beta, eps)
    orl = openrlhf_dpo_losses(pc - rc, pr - rr, beta, eps)

    def ours(kind, smoothing=0.0):
        return losses.dpo_loss(pc, pr, rc, rr, beta, kind, smoothing, chosen_lengths=n_c, rejected_lengths=n_r)[0]

    torch.testing.assert_close(ours("sigmoid"), trl["sigmoid"], atol=1e-5, rtol=0)  # ε = 0: TRL's sigmoid
    torch.testing.assert_close(ours("robust", eps), trl["robust"], atol=1e-5, rtol=0)
    torch.testing.assert_close(ours("ipo"), trl["ipo"], atol=1e-5, rtol=0)
    torch.testing.assert_close(ours("sigmoid", eps), orl["sigmoid"], atol=1e-5, rtol=0)  # cDPO as OpenRLHF
    torch.testing.assert_close(ours("ipo_sum"), orl["ipo_sum"], atol=1e-5, rtol=0)
