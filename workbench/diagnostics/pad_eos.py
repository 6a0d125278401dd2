"""Pitfall P8: pad token = EOS token.

Trainers that infer the loss mask as ``ids != pad`` (TRL's old PPOTrainer built its masks from
``ids != pad``) drop every EOS when the pad token *is* EOS: the policy is never trained to stop,
and its responses run to the length limit. ``stop_rate_after_sft`` trains a fresh tiny model by
SFT both ways and measures how often its greedy answers stop.
"""

from __future__ import annotations

import torch

from workbench.models import tiny_model
from workbench.rollout import sample
from workbench.tasks import Problem, encode_prompts, score_responses
from workbench.trainers.sft import SFTConfig, SFTTrainer


def sft_run(problems: list[Problem], *, pad_equals_eos: bool, steps: int, seed: int = 0, arch: str = "qwen2"):
    """A tiny model trained from scratch by SFT; returns ``(model, tokenizer, history)``."""
    model, tokenizer = tiny_model(arch, seed=seed)
    config = SFTConfig(steps=steps, seed=seed, learning_rate=3e-3, warmup_steps=min(50, steps // 5 + 1),
                       pad_equals_eos=pad_equals_eos, progress=False)
    history = SFTTrainer(model, tokenizer, problems, config).train()
    return model, tokenizer, history


@torch.no_grad()
def stopping_stats(model, tokenizer, problems: list[Problem], *, max_new_tokens: int = 16) -> dict:
    """Greedy generation: share of responses that produced EOS, mean length, accuracy."""
    ids, mask = encode_prompts(tokenizer, [p.prompt for p in problems])
    model.eval()
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, greedy=True)
    rewards = score_responses(tokenizer, problems, rollout.response_ids, rollout.response_mask, rollout.finished)
    return {"finished_fraction": float(rollout.finished.float().mean()),
            "mean_length": float(rollout.response_lengths.float().mean()), "accuracy": float(rewards.mean())}
