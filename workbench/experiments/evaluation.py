"""Held-out evaluation: greedy accuracy of a policy on the task (the number the RL notebooks and the checkpoint
builder report) and the log-probs DPO gives held-out preference pairs, in eval mode, the mode restored after."""

from __future__ import annotations

import numpy as np
import torch

from workbench.modeling.rollout import sample
from workbench.tasks.arithmetic import Problem
from workbench.tasks.encoding import encode_prompts, score_responses
from workbench.tasks.registry import max_new_tokens_for
from workbench.trainers.preferences import build_loss_mask, collate_preferences, summed_logprobs


@torch.no_grad()
def response_results(model, tokenizer, problems: list[Problem], *, greedy: bool = True, generator: torch.Generator | None = None,
                     max_new_tokens: int | None = None, batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(rewards, lengths, finished)`` of one response per problem (stopped at EOS), one entry per problem: the task
    reward, the response's token count (EOS included when produced) and whether it ended with EOS. ``greedy``, or
    sampled at temperature 1 with ``generator`` (as RL samples: the spread of lengths a policy explores, which greedy
    responses do not show). ``max_new_tokens`` None: the task's (``tasks.registry``: 8 for arithmetic, 48 for sums,
    16 for restate)."""
    max_new_tokens = max_new_tokens_for(problems) if max_new_tokens is None else max_new_tokens
    rewards, lengths, finished = [], [], []
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        ids, mask = encode_prompts(tokenizer, [p.prompt for p in chunk])
        rollout = sample(
            model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, greedy=greedy, generator=generator,
        )
        rewards.append(score_responses(tokenizer, chunk, rollout.response_ids, rollout.response_mask, rollout.finished))
        lengths.append(rollout.response_mask.sum(-1).long())
        finished.append(rollout.finished)
    return torch.cat(rewards), torch.cat(lengths), torch.cat(finished)


def greedy_results(model, tokenizer, problems: list[Problem], *, max_new_tokens: int | None = None,
                   batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rewards, lengths)`` of greedy responses to ``problems`` (``response_results`` with ``greedy=True``)."""
    rewards, lengths, _ = response_results(model, tokenizer, problems, max_new_tokens=max_new_tokens, batch_size=batch_size)
    return rewards, lengths


def greedy_accuracy(model, tokenizer, problems: list[Problem], *, max_new_tokens: int | None = None,
                    batch_size: int = 256) -> float:
    """Share of ``problems`` answered correctly by their task's reward (greedy decoding, stopped at EOS)."""
    rewards, _ = greedy_results(model, tokenizer, problems, max_new_tokens=max_new_tokens, batch_size=batch_size)
    return float(rewards.sum()) / len(problems)


def held_out_accuracy(policy, tokenizer, problems, max_new_tokens: int | None = None) -> float:
    """Greedy accuracy in eval mode (no dropout), the policy's mode restored afterwards."""
    training = policy.training
    policy.eval()
    try:
        return greedy_accuracy(policy, tokenizer, problems, max_new_tokens=max_new_tokens)
    finally:
        policy.train(training)


def held_out_pair_logps(policy, tokenizer, pairs, chunk: int = 200) -> dict[str, float]:
    """Mean summed log-prob of the chosen and of the rejected responses (prompt excluded), eval mode."""
    training = policy.training
    policy.eval()
    chosen, rejected = [], []
    try:
        with torch.no_grad():
            for i in range(0, len(pairs), chunk):
                batch = collate_preferences(tokenizer, pairs[i:i + chunk]).to(next(policy.parameters()).device)
                summed, _ = summed_logprobs(policy, batch, build_loss_mask(batch.attention_mask, batch.prompt_lengths, "both"))
                chosen += summed[:batch.num_pairs].tolist()
                rejected += summed[batch.num_pairs:].tolist()
    finally:
        policy.train(training)
    return {"heldout_logp_chosen": float(np.mean(chosen)), "heldout_logp_rejected": float(np.mean(rejected))}
