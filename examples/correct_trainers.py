"""The workbench's own trainer pieces wrapped with the ``workbench.audit`` signatures — every check passes.

Each adapter is a few lines around the function the workbench's trainers call, which is also the
template for wrapping your own code::

    python -m workbench audit examples/correct_trainers.py:grpo_loss --check aggregation --expect grpo

The bugs these fix are in ``examples/buggy_trainers.py``.
"""

from __future__ import annotations

import torch

from workbench.core import losses
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import response_logprobs, token_logprobs
from workbench.trainers.preferences import build_loss_mask

SAMPLING_TEMPERATURE = 0.7
MAX_NEW_TOKENS = 8


def grpo_loss(per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The GRPO paper's reduction: mean over completions of each completion's token mean."""
    return losses.aggregate_loss(per_token_loss, mask, "seq-mean-token-mean")


def dapo_loss(per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """DAPO's token-level mean over the batch (TRL's default ``loss_type``)."""
    return losses.aggregate_loss(per_token_loss, mask, "token-mean")


def logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The trainers' scoring forward: position ids derived from the mask."""
    return token_logprobs(model, input_ids, attention_mask)


def logprobs_at_temperature(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Log-probs of the sampling distribution: logits divided by the sampling temperature."""
    return token_logprobs(model, input_ids, attention_mask, temperature=SAMPLING_TEMPERATURE)


def generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """The rollout engine, stopping at EOS (greedy here; sampling stops the same way)."""
    rollout = sample(model, input_ids, attention_mask, max_new_tokens=max_new_tokens, eos_token_id=model.config.eos_token_id,
                     pad_token_id=model.config.pad_token_id, greedy=True)
    return torch.cat([input_ids, rollout.response_ids], dim=1)


def step(policy, reference, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> dict:
    """Rollout, then π_old recomputed by the trainer's own forward (as verl and OpenRLHF do)."""
    rollout = sample(policy, prompt_ids, prompt_mask, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=policy.config.eos_token_id,
                     pad_token_id=policy.config.pad_token_id, generator=torch.Generator().manual_seed(0))
    args = (prompt_ids, prompt_mask, rollout.response_ids, rollout.response_mask)
    with torch.no_grad():
        old_logprobs = response_logprobs(policy, *args)
        ref_logprobs = response_logprobs(reference, *args)
    return {"old_logprobs": old_logprobs, "logprobs": response_logprobs(policy, *args), "ref_logprobs": ref_logprobs,
            "mask": rollout.response_mask, "rollout_logprobs": rollout.rollout_logprobs}


def dpo_batch_logps(token_logps: torch.Tensor, attention_mask: torch.Tensor, prompt_lengths: list[int]) -> torch.Tensor:
    """The DPO trainer's mask (prompt lengths repeated for both halves), summed over response tokens."""
    return (token_logps * build_loss_mask(attention_mask, prompt_lengths, "both")).sum(-1)


def micro_batch_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, num_items_in_batch: int,
                     gradient_accumulation_steps: int) -> torch.Tensor:
    """Token sum of the micro-batch over the token count of the whole accumulated batch."""
    return losses.aggregate_loss(per_token_loss, mask, "token-mean", normalizer=float(num_items_in_batch))


# The callable each check runs (``workbench.audit.run_checks``) and the options they need.
AUDIT = {"aggregation": grpo_loss, "position_ids": logprobs, "temperature": logprobs_at_temperature, "eos": generate,
         "step0": step, "dpo_mask": dpo_batch_logps, "grad_accumulation": micro_batch_loss}
AUDIT_OPTIONS = {"temperature": SAMPLING_TEMPERATURE, "expect": "grpo"}
