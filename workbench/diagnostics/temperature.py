"""Pitfall P6: sampling at temperature τ, recomputing log-probs at τ = 1.

The sampler draws from softmax(logits / τ). If the trainer recomputes log-probs from the raw
logits, π_train ≠ π_rollout before any update: the first-step importance ratio is not 1 (and the
gap grows as τ moves away from 1). TRL's GRPOTrainer divides by τ; top-p/top-k are not re-applied.
"""

from __future__ import annotations

import torch

from workbench.rollout import sample
from workbench.scoring import response_logprobs
from workbench.tasks import encode_prompts


@torch.no_grad()
def first_step_ratio(model, tokenizer, prompts: list[str], *, temperature: float, rescale: bool, seed: int = 0,
                     max_new_tokens: int = 8) -> dict:
    """max |ρ − 1| and mean |log ρ| when responses sampled at ``temperature`` are rescored
    at ``temperature`` (``rescale=True``, fix) or at 1 (bug)."""
    ids, mask = encode_prompts(tokenizer, prompts)
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, temperature=temperature,
                     eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                     generator=torch.Generator().manual_seed(seed))
    logp = response_logprobs(model, ids, mask, rollout.response_ids, rollout.response_mask,
                             temperature=temperature if rescale else 1.0)
    log_ratio = (logp - rollout.rollout_logprobs)[rollout.response_mask.bool()]
    return {"max_ratio_deviation": float((log_ratio.exp() - 1).abs().max()), "mean_abs_log_ratio": float(log_ratio.abs().mean())}
