"""Pitfall P7: dropout left on in the policy and the reference during RL.

With dropout active, two forwards of the same weights draw different masks: the log-probs the
sampler recorded, the trainer's recomputation and the reference's all disagree, so at step 0
the importance ratio is not 1 and the KL to an identical reference is not 0. The fix
(``workbench.models.disable_dropout``, TRL's ``disable_dropout``) sets every probability to 0.
"""

from __future__ import annotations

import copy

import torch

from workbench.models import disable_dropout
from workbench.rollout import sample
from workbench.scoring import response_logprobs
from workbench.tasks import encode_prompts


def set_dropout(model, p: float) -> None:
    """Switch dropout on at probability ``p`` everywhere it exists (modules and attention)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = p
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = p


@torch.no_grad()
def step0_mismatch(model, tokenizer, prompts: list[str], *, dropout: float, disable: bool, seed: int = 0) -> dict:
    """Ratio and KL at step 0 for a model with dropout ``dropout``; ``disable`` applies the fix."""
    policy = copy.deepcopy(model)
    set_dropout(policy, dropout)
    if disable:
        disable_dropout(policy)
    reference = copy.deepcopy(policy)
    policy.train()
    reference.train()  # the bug: nobody called eval()
    torch.manual_seed(seed)
    ids, mask = encode_prompts(tokenizer, prompts)
    rollout = sample(policy, ids, mask, max_new_tokens=8, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed))
    logp = response_logprobs(policy, ids, mask, rollout.response_ids, rollout.response_mask)
    ref = response_logprobs(reference, ids, mask, rollout.response_ids, rollout.response_mask)
    m = rollout.response_mask.bool()
    return {
        "max_ratio_deviation": float(((logp - rollout.rollout_logprobs)[m].exp() - 1).abs().max()),
        "sequence_kl_k1": float(((rollout.rollout_logprobs - ref) * rollout.response_mask).sum(-1).mean()),
        "max_abs_token_kl": float((rollout.rollout_logprobs - ref)[m].abs().max()),
    }
