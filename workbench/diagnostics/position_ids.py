"""Pitfall S1: left padding without explicit position ids.

A Hugging Face causal LM given only ``input_ids`` and ``attention_mask`` numbers positions
0..T−1 whatever the padding, so a left-padded row's real tokens sit at positions shifted by its
pad count. With rotary embeddings (Llama, Qwen2) attention only sees position *differences*, so
the shift cancels up to float rounding; with learned absolute positions (GPT-2) every token gets
a different position vector and the logits change.

``logprob_drift`` measures it: the largest |Δ log p(token)| between each text scored alone
(no padding, the reference) and the same text in a padded batch.
"""

from __future__ import annotations

import torch

from workbench.batching import pad_sequences
from workbench.scoring import token_logprobs


@torch.no_grad()
def logprobs_alone(model, rows: list[list[int]]) -> list[torch.Tensor]:
    """Per-token log-probs of each row scored on its own (batch of one, no padding)."""
    out = []
    for row in rows:
        ids = torch.tensor([row], device=model.device)
        out.append(token_logprobs(model, ids, torch.ones_like(ids), position_ids="mask")[0].float())
    return out


@torch.no_grad()
def logprobs_padded(model, rows: list[list[int]], *, pad_token_id: int, side: str, extra_pad: int, position_ids: str) -> list[torch.Tensor]:
    """Per-token log-probs of each row's real tokens when scored in one padded batch.

    ``extra_pad`` pads every row by that many more tokens than the longest row needs.
    """
    width = max(len(r) for r in rows) + extra_pad
    ids, mask = pad_sequences(rows, pad_token_id, side=side, length=width)
    ids, mask = ids.to(model.device), mask.to(model.device)
    logprobs = token_logprobs(model, ids, mask, position_ids=position_ids).float()
    out = []
    for i, row in enumerate(rows):
        n = len(row)
        start = width - n if side == "left" else 0
        # target t (t ≥ 1) of the row sits at column start + t, i.e. logprob index start + t − 1
        out.append(logprobs[i, start : start + n - 1])
    return out


def logprob_drift(
    model, rows: list[list[int]], *, pad_token_id: int, side: str = "left", extra_pad: int = 0, position_ids: str = "model"
) -> float:
    """max |log p_padded − log p_alone| over every real token of every row."""
    alone = logprobs_alone(model, rows)
    padded = logprobs_padded(model, rows, pad_token_id=pad_token_id, side=side, extra_pad=extra_pad, position_ids=position_ids)
    return max(float((a - p).abs().max()) for a, p in zip(alone, padded) if len(a))


def drift_table(model, rows, *, pad_token_id: int, extra_pads=(0, 4, 16), sides=("left", "right")) -> list[dict]:
    """Drift for every side × pad length × position-ids mode: rows of a tidy table."""
    table = []
    for side in sides:
        for extra_pad in extra_pads:
            for mode in ("model", "mask"):
                drift = logprob_drift(model, rows, pad_token_id=pad_token_id, side=side, extra_pad=extra_pad, position_ids=mode)
                table.append({"side": side, "extra_pad": extra_pad, "position_ids": mode, "max_abs_dlogp": drift})
    return table


@torch.no_grad()
def first_step_mismatch(model, tokenizer, prompts: list[str], *, position_ids: str, max_new_tokens: int = 8, seed: int = 0) -> dict:
    """What S1 does to PPO before any update.

    Responses are sampled with mask-derived positions (as ``generate`` does) and their log-probs
    recorded; the training forward then rescores them with ``position_ids``. With a reference
    model identical to the policy, the importance ratio ρ = exp(logp_train − logp_rollout) should
    be exactly 1 and the per-token KL estimate (k1 = logp_rollout − logp_ref) exactly 0.
    """
    from workbench.rollout import sample
    from workbench.scoring import response_logprobs
    from workbench.tasks import encode_prompts

    ids, mask = encode_prompts(tokenizer, prompts)
    rollout = sample(
        model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed),
    )
    train_logp = response_logprobs(model, ids, mask, rollout.response_ids, rollout.response_mask, position_ids=position_ids)
    response_mask = rollout.response_mask.bool()
    gap = (train_logp - rollout.rollout_logprobs)[response_mask]
    kl_k1 = (rollout.rollout_logprobs - train_logp)[response_mask]  # reference = the same weights
    return {
        "max_ratio_deviation": float((gap.exp() - 1).abs().max()),
        "mean_abs_kl_k1": float(kl_k1.abs().mean()),
        "sequence_kl_k1": float(((rollout.rollout_logprobs - train_logp) * rollout.response_mask).sum(-1).mean()),
        "max_abs_logp_gap": float(gap.abs().max()),
    }
