"""The maths of PPO, GRPO and DPO as pure functions on tensors.

Every function here takes tensors and returns tensors — no models, no state — and each is
tested against hand-computed values in ``tests/core/test_losses.py``. Conventions:

* ``mask`` is 1 on real response tokens (EOS included) and 0 on padding / post-EOS tokens;
  masked positions never influence a result (statistics, sums and means skip them);
* log-probs are natural-log per-token values of shape (B, T);
* the KL log-ratio is ``r = logp - ref_logp`` (log π/π_ref), as in Schulman's note.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# --------------------------------------------------------------------------------------------
# Masked statistics
# --------------------------------------------------------------------------------------------


def zero_masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` where mask is 1, exactly 0 elsewhere (even where ``values`` is inf or NaN,
    which multiplying by the mask would turn into NaN)."""
    return torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Sum over positions where mask is 1. Masked positions are *selected out* (``torch.where``),
    not multiplied by 0, so an inf or NaN at a padded position cannot turn the result into NaN."""
    selected = zero_masked(values, mask)
    return selected.sum() if dim is None else selected.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean over positions where mask is 1 (0 when there are none, never NaN)."""
    count = mask.to(values.dtype)
    return masked_sum(values, mask, dim) / (count.sum() if dim is None else count.sum(dim)).clamp_min(1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over masked-in positions only (Bessel-corrected by default)."""
    mean = masked_mean(values, mask)
    count = mask.to(values.dtype).sum()
    variance = masked_sum((values - mean) ** 2, mask) / count.clamp_min(1)
    if unbiased:
        variance = variance * count / (count - 1).clamp_min(1)
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x − mean) / std with mean and std computed over real tokens only; masked positions → 0.

    ``shift_mean=False`` rescales without centring (reward whitening in the N-implementation-details
    PPO keeps the reward's sign). Statistics polluted by padded positions are pitfall P13.
    """
    mean, variance = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(variance + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, torch.zeros_like(whitened))


def naive_whiten(values: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Whitening over *every* position, padding included: pitfall P13 (statistics polluted by
    masked tokens). Use ``masked_whiten``."""
    mean, variance = values.mean(), values.var()
    whitened = (values - mean) * torch.rsqrt(variance + eps)
    return whitened if shift_mean else whitened + mean


def tis_weights(trainer_logp: torch.Tensor, rollout_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling weights min(π_trainer / π_rollout, cap), detached (verl PR #2953).

    Corrects a policy-gradient estimate computed from samples of a rollout engine whose
    probabilities differ from the trainer's (bf16 vs fp32, different kernels: pitfall P12).
    """
    return torch.exp(trainer_logp - rollout_logp).clamp(max=cap).detach()


# --------------------------------------------------------------------------------------------
# KL penalty
# --------------------------------------------------------------------------------------------
KL_KINDS = ("k1", "k2", "k3", "low_var_kl")


def outside_clip_window(log_ratio: torch.Tensor, clip: float) -> float:
    """Share of tokens whose ratio exp(``log_ratio``) lies outside the clip window [1 − ε, 1 + ε], where the clipped
    surrogate stops their gradient (0 for an empty selection)."""
    return float(((log_ratio.exp() - 1).abs() > clip).float().mean()) if log_ratio.numel() else 0.0


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token KL(π‖π_ref) estimate from samples of π, with r = logp − ref_logp:

    * ``k1`` = r (unbiased, high variance, can be negative);
    * ``k2`` = r²/2 (biased, low variance, ≥ 0);
    * ``k3`` = exp(−r) − 1 + r (unbiased, ≥ 0; TRL GRPO);
    * ``low_var_kl`` = k3 of the log-ratio clamped to [−20, 20], clamped to [−10, 10] (verl 0.9.1).

    k3 grows like exp(−r): below r ≈ −88.7 it exceeds float32 and is inf, in TRL's formula as here (the
    reason verl clamps); log-probabilities of real tokens rarely differ by that much.
    """
    log_ratio = logp - ref_logp
    if kind == "low_var_kl":
        log_ratio = log_ratio.clamp(-20, 20)
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind in ("k3", "low_var_kl"):
        # expm1 keeps precision near r = 0; the clamp removes rounding below 0 (k3 ≥ 0 exactly).
        k3 = (torch.expm1(-log_ratio) + log_ratio).clamp_min(0)
        return k3.clamp(-10, 10) if kind == "low_var_kl" else k3
    raise ValueError(f"Unknown KL estimator kind {kind!r}; choose one of {KL_KINDS}")


# --------------------------------------------------------------------------------------------
# PPO
# --------------------------------------------------------------------------------------------


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over right-padded response tokens: ``(advantages, returns)``.

    δ_t = r_t + γ·V_{t+1}·m_{t+1} − V_t and A_t = δ_t + γλ·m_{t+1}·A_{t+1}: the episode ends at the
    last real token (its successor is masked), so nothing after it leaks back. Returns = A + V.
    Masked positions get 0 advantage and 0 return.
    """
    keep = mask.bool()
    mask = mask.to(values.dtype)
    values = torch.where(keep, values, torch.zeros_like(values))
    rewards = torch.where(keep, rewards, torch.zeros_like(rewards))
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    next_mask = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value * next_mask - values[:, t]
        next_advantage = delta + gamma * lam * next_mask * next_advantage
        advantages[:, t] = next_advantage
        next_value, next_mask = values[:, t], mask[:, t]
    advantages = torch.where(keep, advantages, torch.zeros_like(advantages))
    return advantages, torch.where(keep, advantages + values, torch.zeros_like(values))


def clipped_surrogate(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_low: float = 0.2, clip_high: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped policy loss −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A) and where it clipped."""
    clip_high = clip_low if clip_high is None else clip_high
    ratio = torch.exp(logp - old_logp)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped)


def ppo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    loss_agg: str = "token-mean",
    weights: torch.Tensor | None = None,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, dict]:
    """PPO clipped surrogate aggregated with ``loss_agg``; stats: clip fraction, approx-KL, ratio.

    ``weights`` (detached, per token) multiply the per-token loss: truncated importance sampling
    (``tis_weights``) corrects for a rollout engine whose log-probs differ from the trainer's.
    ``normalizer`` replaces the aggregation's denominator (``aggregate_loss``; data-parallel processes pass the global one).
    """
    per_token, was_clipped = clipped_surrogate(logp, old_logp, advantages, clip_low, clip_high)
    if weights is not None:
        per_token = per_token * weights
    loss = aggregate_loss(per_token, mask, loss_agg, normalizer=normalizer)
    with torch.no_grad():
        log_ratio = logp - old_logp
        stats = {
            "clip_fraction": float(masked_mean(was_clipped.float(), mask)),
            # k3 estimate of KL(old‖new), as in CleanRL: mean((ρ − 1) − log ρ).
            "approx_kl": float(masked_mean(torch.exp(log_ratio) - 1 - log_ratio, mask)),
            "ratio_mean": float(masked_mean(torch.exp(log_ratio), mask)),
        }
    return loss, stats


def ppo_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float = 0.2,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, float]:
    """0.5·max((V − R)², (V_clip − R)²), V_clip = V_old + clip(V − V_old, ±clip); token mean.

    Returns ``(loss, clip_fraction)``. ``clip=None`` disables clipping. ``normalizer`` replaces the token count the
    mean divides by (data-parallel processes pass the global one).
    """
    def mean(values):
        return masked_mean(values, mask) if normalizer is None else masked_sum(values, mask) / max(normalizer, 1e-12)

    unclipped = (values - returns) ** 2
    if clip is None:
        return 0.5 * mean(unclipped), 0.0
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)
    clipped = (clipped_values - returns) ** 2
    loss = 0.5 * mean(torch.maximum(unclipped, clipped))
    return loss, float(masked_mean((clipped > unclipped).float(), mask))


# --------------------------------------------------------------------------------------------
# Loss aggregation (pitfall S5)
# --------------------------------------------------------------------------------------------
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
# TRL 1.16 ``loss_type`` names: the same formulas, but TRL's per-sequence means count a fully
# masked row (e.g. a truncated completion under ``mask_truncated_completions``) as a sequence
# with loss 0, where verl 0.9.1 leaves it out of the count.
LOSS_AGG_ALIASES = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dapo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
}
ALIASES_COUNTING_EMPTY_ROWS = ("grpo", "dr_grpo")


def canonical_loss_agg(mode: str) -> str:
    """The verl-style name of a loss aggregation mode given by verl or TRL name."""
    canonical = LOSS_AGG_ALIASES.get(mode, mode)
    if canonical not in LOSS_AGG_MODES:
        valid = ", ".join(LOSS_AGG_MODES + tuple(LOSS_AGG_ALIASES))
        raise ValueError(f"Unknown loss aggregation mode {mode!r}; valid modes: {valid}")
    return canonical


def counts_empty_rows(mode: str) -> bool:
    """Whether ``mode``'s mean over sequences counts fully masked rows (TRL's ``grpo``/``dr_grpo``)
    or leaves them out (verl's ``seq-mean-*`` names)."""
    canonical_loss_agg(mode)
    return mode in ALIASES_COUNTING_EMPTY_ROWS


def aggregation_denominator(mask: torch.Tensor, mode: str, max_len: int | None = None) -> float:
    """What ``aggregate_loss`` divides its sum by for this batch: tokens, sequences, or
    sequences × max_len. Summed over processes, it gives the normaliser of the global batch."""
    canonical = canonical_loss_agg(mode)
    if canonical == "token-mean":
        return float(mask.sum())
    sequences = mask.shape[0] if counts_empty_rows(mode) else int((mask.sum(-1) > 0).sum())
    if canonical == "seq-mean-token-sum-norm":
        return float(sequences * (mask.shape[-1] if max_len is None else max_len))
    return float(sequences)


def aggregate_loss(
    per_token_loss: torch.Tensor, mask: torch.Tensor, mode: str, max_len: int | None = None, normalizer: float | None = None
) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar (verl 0.9.1 ``agg_loss`` / TRL 1.16 ``loss_type``):

    * ``token-mean``: Σ(loss·mask) / Σmask over the whole batch (TRL ``bnpo``/``dapo``);
    * ``seq-mean-token-mean``: mean over sequences of each sequence's token mean (TRL ``grpo``,
      the GRPO paper);
    * ``seq-mean-token-sum``: mean over sequences of each sequence's token sum;
    * ``seq-mean-token-sum-norm``: Σ(loss·mask) / (sequences × max_len), ``max_len`` defaulting to
      T (TRL ``dr_grpo``, Dr. GRPO).

    Fully masked rows: the verl names leave them out of the count of sequences (verl divides by
    the number of rows with at least one token); the TRL aliases ``grpo`` and ``dr_grpo`` count
    them (TRL averages over every row, an empty one contributing 0). An all-masked batch gives 0,
    never NaN. ``normalizer`` replaces the denominator (see ``aggregation_denominator``):
    data-parallel processes pass the global one.
    """
    canonical = canonical_loss_agg(mode)
    if normalizer is None:
        normalizer = aggregation_denominator(mask, mode, max_len)
    normalizer = normalizer if normalizer > 0 else 1.0  # an all-masked batch: the sum is 0 anyway
    if canonical in ("token-mean", "seq-mean-token-sum-norm"):
        return masked_sum(per_token_loss, mask) / normalizer
    sequence_sums = masked_sum(per_token_loss, mask, dim=-1)
    if canonical == "seq-mean-token-mean":
        sequence_sums = sequence_sums / mask.to(per_token_loss.dtype).sum(-1).clamp_min(1)
    return sequence_sums.sum() / normalizer  # empty sequences contribute 0 to the sum


# --------------------------------------------------------------------------------------------
# GRPO
# --------------------------------------------------------------------------------------------
SCALE_REWARDS = ("group", "batch", "none")


def group_advantages(rewards: torch.Tensor, num_generations: int, scale: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """A_i = (R_i − mean_group(R)) / (std + eps) for rewards laid out group after group.

    ``scale``: ``"group"`` divides by each group's std, ``"batch"`` by the std of the whole batch,
    ``"none"`` does not divide (Dr. GRPO). Stds are Bessel-corrected, as ``torch.std`` (TRL).
    """
    if scale not in SCALE_REWARDS:
        raise ValueError(f"Unknown scale_rewards {scale!r}; choose one of {SCALE_REWARDS}")
    if num_generations < 2:
        raise ValueError(f"num_generations must be ≥ 2 for group-relative advantages, got {num_generations}")
    if rewards.numel() % num_generations:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of num_generations={num_generations}")
    grouped = rewards.view(-1, num_generations)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    if scale == "group":
        return centred / (grouped.std(dim=1).repeat_interleave(num_generations) + eps)
    if scale == "batch":
        return centred / (rewards.std() + eps)
    return centred


# --------------------------------------------------------------------------------------------
# DPO
# --------------------------------------------------------------------------------------------
DPO_LOSS_TYPES = ("sigmoid", "robust", "ipo", "ipo_sum", "hinge")


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    chosen_lengths: torch.Tensor | None = None,
    rejected_lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair DPO losses and implicit rewards ``(losses, chosen_rewards, rejected_rewards)``.

    Log-probs are **summed** over completion tokens. With the log-ratios
    ρ_c = log π_c − log π_ref,c, ρ_r = log π_r − log π_ref,r and h = ρ_c − ρ_r, ε = label smoothing:

    * ``sigmoid`` — DPO, −log σ(βh); with ε > 0 conservative DPO (cDPO):
      −(1−ε)·log σ(βh) − ε·log σ(−βh), as OpenRLHF's ``DPOLoss`` and the original DPO code.
      (TRL 1.16's ``sigmoid`` ignores ``label_smoothing``; with ε = 0 they agree.)
    * ``robust`` — TRL 1.16 ``robust`` (robust DPO): [−(1−ε)·log σ(βh) + ε·log σ(−βh)] / (1 − 2ε).
    * ``ipo`` — TRL 1.16 ``ipo``: each log-ratio divided by its completion's token count,
      (ρ_c/n_c − ρ_r/n_r − 1/(2β))²; needs ``chosen_lengths``/``rejected_lengths`` (clamped at 1).
    * ``ipo_sum`` — OpenRLHF's IPO on summed log-probs: (h − 1/(2β))².
    * ``hinge`` — SLiC: max(0, 1 − βh).

    Implicit rewards are β·ρ (summed log-ratios), detached, for every loss type.
    """
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"Unknown DPO loss_type {loss_type!r}; choose one of {DPO_LOSS_TYPES}")
    chosen_log_ratio = policy_chosen_logps - ref_chosen_logps
    rejected_log_ratio = policy_rejected_logps - ref_rejected_logps
    h = chosen_log_ratio - rejected_log_ratio
    eps = label_smoothing
    if loss_type == "sigmoid":
        losses = -(1 - eps) * F.logsigmoid(beta * h) - eps * F.logsigmoid(-beta * h)
    elif loss_type == "robust":
        if not 0 <= eps < 0.5:
            raise ValueError(f"robust DPO needs label_smoothing in [0, 0.5), got {eps}")
        losses = (-(1 - eps) * F.logsigmoid(beta * h) + eps * F.logsigmoid(-beta * h)) / (1 - 2 * eps)
    elif loss_type == "ipo":
        if chosen_lengths is None or rejected_lengths is None:
            raise ValueError("loss_type='ipo' (TRL's length-averaged IPO) needs chosen_lengths and rejected_lengths")
        chosen_count, rejected_count = chosen_lengths.to(h.dtype).clamp_min(1), rejected_lengths.to(h.dtype).clamp_min(1)
        averaged = chosen_log_ratio / chosen_count - rejected_log_ratio / rejected_count
        losses = (averaged - 1 / (2 * beta)) ** 2
    elif loss_type == "ipo_sum":
        losses = (h - 1 / (2 * beta)) ** 2
    else:
        losses = torch.relu(1 - beta * h)
    return losses, beta * chosen_log_ratio.detach(), beta * rejected_log_ratio.detach()
