"""Greedy accuracy of a policy on the task: the number the RL notebooks and the checkpoint builder report."""

from __future__ import annotations

import torch

from workbench.modeling.rollout import sample
from workbench.tasks.arithmetic import Problem
from workbench.tasks.encoding import encode_prompts, score_responses


@torch.no_grad()
def greedy_accuracy(model, tokenizer, problems: list[Problem], *, max_new_tokens: int = 8, batch_size: int = 256) -> float:
    """Share of ``problems`` answered exactly (greedy decoding, stopped at EOS)."""
    correct = 0.0
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        ids, mask = encode_prompts(tokenizer, [p.prompt for p in chunk])
        rollout = sample(
            model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, greedy=True,
        )
        correct += float(score_responses(tokenizer, chunk, rollout.response_ids, rollout.response_mask, rollout.finished).sum())
    return correct / len(problems)
