"""A trainer and a separate sampler copy kept in step by a weight sync: the gap between them over training steps.

Every RL system with a rollout engine (vLLM, SGLang, a colocated copy) keeps two copies of the policy: the trainer's,
which the optimizer updates, and the sampler's, which generates. A *push* (``push(trainer, sampler)``) copies the one
into the other every ``sync_interval`` steps. When the push misses something (a LoRA adapter, an untied LM head, the
weights an engine dropped while asleep) nothing fails: the sampler keeps generating from stale weights and the only
trace is the log-prob gap between the two copies on the sampled tokens. ``sync_training`` runs that loop on a small
model and records, per step, the three numbers the weight-sync notebooks plot:

* ``gap``: mean |log μ − log π_θ| per sampled token, the sampler's log-probs μ against the trainer's π_θ before the
  step's update (TRL logs it as ``sampling/sampling_logp_difference/mean``); with a correct push at interval 1 it is
  float noise (~1e-7 nats in fp32), at interval k it rises for k − 1 steps and falls back at each sync;
* ``kl``: mean (log μ − log π_θ), the k1 estimate of KL(μ ‖ π_θ) on the sampler's tokens (verl's ``rollout_corr/kl``);
* ``drift``: mean |log π_θ − log π_0| on the same tokens, how far the trainer moved from the initial policy π_0;
* ``reward`` and ``reward_spread``: the batch's mean task reward and its std (0: every advantage is 0, no update).

The update is plain REINFORCE with a batch-mean baseline, as an on-policy trainer that trusts its sampler takes it.
Pitfall modules supply the push (bug and fix) and the model copies; this module only runs and records the loop.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from workbench.modeling.rollout import sample
from workbench.modeling.scoring import response_logprobs
from workbench.tasks import decode_responses, encode_prompts, reward

Push = Callable[[torch.nn.Module, torch.nn.Module], None]


def rollout_batch(sampler, tokenizer, problems, *, seed: int, max_new_tokens: int = 6) -> dict:
    """Responses sampled from ``sampler`` with its own log-probs μ, and their task rewards."""
    ids, mask = encode_prompts(tokenizer, [p.prompt for p in problems])
    with torch.no_grad():
        rollout = sample(sampler, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed))
    texts = decode_responses(tokenizer, rollout.response_ids, rollout.response_mask)
    rewards = torch.tensor([reward(t, bool(f), p) for t, f, p in zip(texts, rollout.finished.tolist(), problems, strict=True)],
                           dtype=torch.float32)
    return {"rollout": rollout, "rewards": rewards}


def scored(model, rollout) -> torch.Tensor:
    """``model``'s per-token log-probs (B, R) of the rollout's responses."""
    r = rollout
    return response_logprobs(model, r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)


def step_record(step: int, sampler_logp: torch.Tensor, trainer_logp: torch.Tensor, initial_logp: torch.Tensor,
                mask: torch.Tensor) -> dict:
    """The numbers of one step on the response tokens selected by ``mask`` (see the module doc)."""
    m = mask.bool()
    mu, pi, pi0 = sampler_logp[m].double(), trainer_logp[m].double(), initial_logp[m].double()
    return {"step": step, "gap": float((mu - pi).abs().mean()), "max_gap": float((mu - pi).abs().max()),
            "kl": float((mu - pi).mean()), "drift": float((pi - pi0).abs().mean()), "tokens": int(m.sum())}


def sync_training(trainer, sampler, tokenizer, problems, *, steps: int, sync_interval: int, push: Push,
                  batch_size: int = 8, lr: float = 1e-3, seed: int = 0, max_new_tokens: int = 6,
                  initial=None, before_rollout: Callable[[torch.nn.Module, int], None] | None = None,
                  after_rollout: Callable[[torch.nn.Module, int], None] | None = None) -> list[dict]:
    """Train ``trainer`` for ``steps`` REINFORCE steps on batches sampled by ``sampler``, calling ``push(trainer,
    sampler)`` after every ``sync_interval``-th update; one ``step_record`` per step (before that step's update).

    ``initial`` scores the drift (default: a frozen copy of ``trainer`` as it is now). ``before_rollout(sampler,
    step)`` runs just before each rollout (an engine waking up, for example), ``after_rollout(sampler, step)`` just after
    it (the engine going back to sleep). Both models are changed in place: pass
    copies. Batches are drawn from ``problems`` in an order fixed by ``seed``, and so are the sampler's draws.
    """
    if sync_interval < 1:
        raise ValueError(f"sync_interval={sync_interval}: the number of updates between pushes must be ≥ 1")
    initial = initial if initial is not None else copy.deepcopy(trainer)
    trainable = [p for p in trainer.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=lr)
    order = torch.randperm(len(problems), generator=torch.Generator().manual_seed(seed)).tolist()
    records = []
    for step in range(steps):
        picked = [problems[order[(step * batch_size + i) % len(order)]] for i in range(batch_size)]
        if before_rollout is not None:
            before_rollout(sampler, step)
        batch = rollout_batch(sampler, tokenizer, picked, seed=seed * 100_003 + step, max_new_tokens=max_new_tokens)
        if after_rollout is not None:
            after_rollout(sampler, step)
        r = batch["rollout"]
        logp = scored(trainer, r)
        with torch.no_grad():
            records.append({**step_record(step, r.rollout_logprobs, logp.detach(), scored(initial, r), r.response_mask),
                            "reward": float(batch["rewards"].mean()), "reward_spread": float(batch["rewards"].std())})
        advantage = batch["rewards"] - batch["rewards"].mean()
        loss = -(advantage * (logp * r.response_mask).sum(-1)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % sync_interval == 0:
            with torch.no_grad():
                push(trainer, sampler)
    return records


def no_update_reason(histories) -> str | None:
    """Why the trainer never moved, or None: every batch of every run got one reward for all its responses (a checkpoint
    that never, or always, solves the task), so every REINFORCE advantage was 0. ``histories``: ``sync_training``
    records, any nesting of lists."""
    records = list(_records(histories))
    if not records or any(r.get("reward_spread", 1.0) != 0 for r in records):
        return None
    return (f"every sampled batch got one reward for all its responses (mean {records[-1].get('reward', 0):.2g}: this "
            "checkpoint does not solve the task, or always does), so every REINFORCE advantage is 0 and the trainer never "
            "moved, so nothing stale or re-anchored can show; use a checkpoint trained on the task")


def _records(histories):
    for item in histories:
        if isinstance(item, dict):
            yield item
        else:
            yield from _records(item)
