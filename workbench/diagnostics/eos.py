"""Pitfall S3: rollouts that do not stop at EOS (and P8: pad token = EOS token).

TRL's old PPOTrainer built its generation config without ``eos_token_id``: every rollout decoded
``max_new_tokens`` steps and the text after the stop token was cut afterwards. In a batch, decoding
can stop only when every row has finished, so the saving of the fix is
``max_new_tokens − longest response`` steps per batch, and every token after a row's EOS is waste.

``generation_cost`` measures both modes on the same prompts with the same random stream (the
responses are identical, only the compute differs). ``eos_in_loss_mask`` shows the P8 variant: a
loss mask inferred as ``ids != pad`` drops the EOS action when pad == EOS.
"""

from __future__ import annotations

import torch

from workbench.rollout import Rollout, sample
from workbench.tasks import encode_prompts


def rollout_pair(model, tokenizer, prompts: list[str], *, max_new_tokens: int, seed: int = 0, temperature: float = 1.0) -> dict[str, Rollout]:
    """The same prompts sampled with ``stop_at_eos`` True (fix) and False (bug), same random stream."""
    ids, mask = encode_prompts(tokenizer, prompts)
    out = {}
    for name, stop in (("fix", True), ("bug", False)):
        out[name] = sample(
            model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, temperature=temperature, stop_at_eos=stop,
            generator=torch.Generator().manual_seed(seed),
        )
    return out


def generation_cost(rollout: Rollout) -> dict:
    """Decode steps, tokens generated/needed, waste, wall time of one rollout."""
    return {
        "decode_steps": rollout.decode_steps,
        "tokens_generated": rollout.tokens_generated,
        "tokens_needed": rollout.tokens_needed,
        "waste_fraction": rollout.waste_fraction,
        "seconds": rollout.seconds,
        "longest_response": int(rollout.response_lengths.max()),
        "finished_fraction": float(rollout.finished.float().mean()),
    }


def same_responses(a: Rollout, b: Rollout) -> bool:
    """Identical kept tokens and masks (the wider rollout's extra columns must be fully masked)."""
    width = min(a.response_ids.shape[1], b.response_ids.shape[1])
    wider = a if a.response_ids.shape[1] > width else b
    return (
        torch.equal(a.response_ids[:, :width], b.response_ids[:, :width])
        and torch.equal(a.response_mask[:, :width], b.response_mask[:, :width])
        and int(wider.response_mask[:, width:].sum()) == 0
    )


def mask_from_pad(response_ids: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """The naive loss mask ``ids != pad`` some trainers infer after the fact."""
    return (response_ids != pad_token_id).long()


def eos_in_loss_mask(response_ids: torch.Tensor, loss_mask: torch.Tensor, eos_token_id: int) -> int:
    """How many EOS actions the loss mask keeps (each finished response should keep one)."""
    return int(((response_ids == eos_token_id) & loss_mask.bool()).sum())
