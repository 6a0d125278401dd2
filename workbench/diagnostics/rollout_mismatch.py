"""Pitfall P12: the rollout engine and the trainer disagree on log-probs.

A bf16 inference engine samples, an fp32 trainer recomputes: π_old (trainer) ≠ π_rollout even
before any update, so the "on-policy" ratio is not 1 and the policy gradient is estimated from
samples of a slightly different policy. Truncated importance sampling (verl PR #2953) reweights
each token by min(π_old / π_rollout, C).
"""

from __future__ import annotations

import copy

import torch

from workbench.losses import tis_weights
from workbench.rollout import sample
from workbench.scoring import response_logprobs
from workbench.tasks import encode_prompts


@torch.no_grad()
def rollout_vs_trainer(model, tokenizer, prompts: list[str], *, rollout_dtype: torch.dtype, cap: float = 2.0, seed: int = 0) -> dict:
    """Per-token log-ratio trainer/rollout for samples of a ``rollout_dtype`` copy of ``model``."""
    engine = copy.deepcopy(model).to(rollout_dtype)
    ids, mask = encode_prompts(tokenizer, prompts)
    rollout = sample(engine, ids, mask, max_new_tokens=8, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed))
    trainer_logp = response_logprobs(model, ids, mask, rollout.response_ids, rollout.response_mask)
    m = rollout.response_mask.bool()
    log_ratio = (trainer_logp - rollout.rollout_logprobs)[m]
    weights = tis_weights(trainer_logp, rollout.rollout_logprobs, cap)[m]
    return {
        "log_ratio": log_ratio,
        "max_ratio_deviation": float((log_ratio.exp() - 1).abs().max()),
        "mean_abs_log_ratio": float(log_ratio.abs().mean()),
        "tis_weights": weights,
        "tis_max_weight": float(weights.max()),
        "tis_clipped_fraction": float((log_ratio.exp() > cap).float().mean()),
    }
