"""Pitfall P10: gradient accumulation with a token-mean loss.

With micro-batches of different token counts, averaging each micro-batch's token mean is not the
token mean of the accumulated batch: tokens in short micro-batches weigh more (the 2024
gradient-accumulation loss bug in transformers). The fix divides each micro-batch's token *sum*
by the token count of the whole accumulated batch.
"""

from __future__ import annotations

import torch

from workbench.scoring import token_logprobs

NORMALIZATIONS = ("global", "per_micro_batch")


def policy_gradient_loss_sum(model, ids, mask, advantages) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ over real targets of −A·log p, and the number of those targets."""
    logp = token_logprobs(model, ids, mask)
    targets = (mask[:, 1:] * mask[:, :-1]).float()
    return -(advantages[:, None] * logp * targets).sum(), targets.sum()


def accumulated_gradient(model, ids, mask, advantages, *, micro_batches: int, normalization: str) -> torch.Tensor:
    """The gradient after accumulating ``micro_batches`` micro-batches (rows in order)."""
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization={normalization!r}; choose one of {NORMALIZATIONS}")
    model.zero_grad(set_to_none=True)
    chunks = torch.arange(ids.shape[0]).chunk(micro_batches)
    total_tokens = float((mask[:, 1:] * mask[:, :-1]).sum())
    for rows in chunks:
        loss_sum, tokens = policy_gradient_loss_sum(model, ids[rows], mask[rows], advantages[rows])
        if normalization == "global":
            loss = loss_sum / total_tokens
        else:  # the bug: each micro-batch's own token mean, averaged over micro-batches
            loss = loss_sum / tokens.clamp_min(1) / len(chunks)
        loss.backward()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return grad


def full_batch_gradient(model, ids, mask, advantages) -> torch.Tensor:
    return accumulated_gradient(model, ids, mask, advantages, micro_batches=1, normalization="global")


def relative_error(gradient: torch.Tensor, reference: torch.Tensor) -> float:
    return float((gradient - reference).norm() / reference.norm())
