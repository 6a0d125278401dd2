"""Deliberately buggy trainer pieces, one per ``workbench.audit`` check — each check fails on its bug.

Every function has the signature its check expects, and each bug is one that shipped in a real
trainer (see the docstrings). Point the CLI at them::

    python -m workbench audit examples/buggy_trainers.py:grpo_loss --check aggregation --expect grpo
    python -m workbench audit examples/buggy_trainers.py:logprobs_without_position_ids --check position_ids \
        --model tiny-arith-gpt2

``examples/correct_trainers.py`` holds the fixed versions (adapters around the workbench's own code).
"""

from __future__ import annotations

import copy

import torch

SAMPLING_TEMPERATURE = 0.7  # the temperature the (buggy) trainer samples at
MAX_NEW_TOKENS = 8


def _token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def _mask_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


# ---- S5: check_aggregation ------------------------------------------------------------------
def grpo_loss(per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """"GRPO loss: mean over completions of each completion's token mean (the GRPO paper)".

    Bug (TRL 0.16): the code is a global token mean over the batch, so long completions weigh more
    and a zero-mean advantage group does not give loss 0. Audit with ``expected="grpo"``.
    """
    return (per_token_loss * mask).sum() / mask.sum()


# ---- S1: check_position_ids -----------------------------------------------------------------
def logprobs_without_position_ids(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Bug (OpenRLHF before PR #218, TRL #6800): only ``input_ids`` and ``attention_mask`` reach the
    model, which numbers positions 0..T−1, so a left-padded row's positions shift by its pad count."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
    return _token_logprobs(logits, input_ids)


# ---- P6: check_temperature ------------------------------------------------------------------
def logprobs_without_temperature(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The trainer samples at ``SAMPLING_TEMPERATURE`` but recomputes log-probs from the raw logits.

    Bug (TRL before #3029): the logits are never divided by τ, so at step 0 the ratio to the
    sampler's log-probs is not 1. Audit with ``temperature=SAMPLING_TEMPERATURE``.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=_mask_positions(attention_mask),
                   use_cache=False).logits[:, :-1]
    return _token_logprobs(logits, input_ids)


# ---- S3: check_eos_stopping -----------------------------------------------------------------
@torch.no_grad()
def generate_without_eos(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Greedy decoding with no stop condition (TRL's old PPOTrainer: no ``eos_token_id`` in the
    generation config): every batch decodes ``max_new_tokens`` steps, EOS or not."""
    ids, mask = input_ids, attention_mask
    for _ in range(max_new_tokens):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=_mask_positions(mask), use_cache=False).logits
        token = logits[:, -1].argmax(-1, keepdim=True)
        ids, mask = torch.cat([ids, token], 1), torch.cat([mask, torch.ones_like(token)], 1)
    return ids


# ---- P12: check_step0 -------------------------------------------------------------------------
def step_with_rollout_logprobs(policy, reference, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> dict:
    """π_old taken from the rollout engine — here a bf16 copy of the policy, as a vLLM/SGLang engine
    in lower precision would be — while the trainer scores in fp32 (verl #2088, OpenRLHF #931).

    Bug: at step 0 the ratio π_θ/π_old is not 1 and the clip fires on numerical noise.
    """
    from workbench.modeling.rollout import sample
    from workbench.modeling.scoring import response_logprobs

    engine = copy.deepcopy(policy).to(torch.bfloat16)
    rollout = sample(engine, prompt_ids, prompt_mask, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=policy.config.eos_token_id,
                     pad_token_id=policy.config.pad_token_id, generator=torch.Generator().manual_seed(0))
    args = (prompt_ids, prompt_mask, rollout.response_ids, rollout.response_mask)
    logprobs = response_logprobs(policy, *args)
    with torch.no_grad():
        ref_logprobs = response_logprobs(reference, *args)
    return {"old_logprobs": rollout.rollout_logprobs, "logprobs": logprobs, "ref_logprobs": ref_logprobs,
            "mask": rollout.response_mask}


# ---- S4: check_dpo_mask -----------------------------------------------------------------------
def dpo_batch_logps(token_logps: torch.Tensor, attention_mask: torch.Tensor, prompt_lengths: list[int]) -> torch.Tensor:
    """OpenRLHF's ``_get_batch_logps`` before commit 6106fb22 (OpenRLHF #294): 2B mask rows zipped with
    B prompt lengths — ``zip`` stops after the chosen rows, so rejected rows keep their prompt."""
    loss_masks = attention_mask.clone().bool()
    for mask, source_len in zip(loss_masks, prompt_lengths, strict=False):  # the bug: 2B rows, B lengths
        mask[:source_len] = False
    return (token_logps * loss_masks[:, 1:]).sum(-1)


# ---- P10: check_grad_accumulation --------------------------------------------------------------
def micro_batch_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, num_items_in_batch: int,
                     gradient_accumulation_steps: int) -> torch.Tensor:
    """Each micro-batch's own token mean, divided by the number of micro-batches (the 2024
    gradient-accumulation bug): tokens of short micro-batches weigh more than in the full batch."""
    return (per_token_loss * mask).sum() / mask.sum() / gradient_accumulation_steps


# The callable each check runs (``workbench.audit.run_checks``) and the options they need.
AUDIT = {"aggregation": grpo_loss, "position_ids": logprobs_without_position_ids, "temperature": logprobs_without_temperature,
         "eos": generate_without_eos, "step0": step_with_rollout_logprobs, "dpo_mask": dpo_batch_logps,
         "grad_accumulation": micro_batch_loss}
AUDIT_OPTIONS = {"temperature": SAMPLING_TEMPERATURE, "expect": "grpo"}
