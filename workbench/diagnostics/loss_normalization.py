"""Pitfall S5: how a GRPO loss is normalised over tokens and sequences.

The GRPO paper averages token losses within each sequence, then over sequences
(``seq-mean-token-mean``); TRL first implemented Σ(loss·mask)/Σmask over the whole batch
(``token-mean``). They weight tokens differently:

=========================== ===================================================
mode                        gradient weight of one token of a length-L_i sequence
=========================== ===================================================
token-mean                  1 / Σ_j L_j
seq-mean-token-mean         1 / (B · L_i)            (short sequences weigh more per token)
seq-mean-token-sum          1 / B
seq-mean-token-sum-norm     1 / (B · max_len)
=========================== ===================================================

The zero-loss probe makes the difference visible in the loss *value*: with β = 0 and one
iteration the per-token loss is −A_i (ρ ≡ 1) and group advantages have zero mean, so
``seq-mean-token-mean`` gives exactly 0 while ``token-mean`` gives −Σ A_i L_i / Σ L_i ≠ 0 when
lengths differ. Gradients are non-zero in every mode.
"""

from __future__ import annotations

import torch

from workbench import losses
from workbench.batching import pad_sequences
from workbench.scoring import response_logprobs
from workbench.tasks import encode_prompts


def analytic_token_weights(lengths: list[int], mode: str, max_len: int | None = None) -> list[float]:
    """∂loss/∂(per-token loss) for one token of each sequence, from the table above."""
    canonical = losses.canonical_loss_agg(mode)
    total = sum(lengths)
    max_len = max(lengths) if max_len is None else max_len
    # verl names leave fully masked rows out of the count of sequences, TRL's grpo/dr_grpo count them
    sequences = len(lengths) if losses.counts_empty_rows(mode) else sum(1 for m in lengths if m > 0)
    weights = {
        "token-mean": lambda n: 1 / total,
        "seq-mean-token-mean": lambda n: 1 / (sequences * n),
        "seq-mean-token-sum": lambda n: 1 / sequences,
        "seq-mean-token-sum-norm": lambda n: 1 / (sequences * max_len),
    }[canonical]
    return [weights(n) if n > 0 else 0.0 for n in lengths]


def measured_token_weights(lengths: list[int], mode: str, max_len: int | None = None) -> list[float]:
    """The same weights measured by autograd through ``losses.aggregate_loss``."""
    width = max(lengths) if max_len is None else max_len
    per_token = torch.zeros(len(lengths), width, requires_grad=True)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
    losses.aggregate_loss(per_token, mask, mode, max_len=max_len).backward()
    return [float(per_token.grad[i, 0]) if n > 0 else 0.0 for i, n in enumerate(lengths)]


def effective_kl_coefficient(lengths: list[int], beta: float, loss_agg: str) -> list[float]:
    """β as felt by each sequence's tokens when the KL is normalised per sequence but the policy
    term by ``loss_agg`` (the seed's mix): β · w_KL / w_policy, with w_KL = 1/(B·L_i)."""
    policy = analytic_token_weights(lengths, loss_agg)
    kl = analytic_token_weights(lengths, "seq-mean-token-mean")
    return [beta * k / p if p > 0 else 0.0 for k, p in zip(kl, policy)]


def zero_loss_probe(model, tokenizer, prompt: str, completions: list[str], rewards: list[float], modes=losses.LOSS_AGG_MODES,
                    scale_rewards: str = "group", max_len: int | None = None) -> dict[str, dict]:
    """The S5 probe on a real model: one group of completions of different lengths, β = 0,
    ρ ≡ 1. Returns ``{mode: {"loss": float, "grad_norm": float}}``."""
    prompt_ids, prompt_mask = encode_prompts(tokenizer, [prompt] * len(completions))
    rows = [tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for c in completions]
    response_ids, response_mask = pad_sequences(rows, tokenizer.pad_token_id, side="right")
    advantages = losses.group_advantages(torch.tensor(rewards, dtype=torch.float32), len(completions), scale_rewards)
    results = {}
    for mode in modes:
        model.zero_grad(set_to_none=True)
        logp = response_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask)
        per_token, _ = losses.clipped_surrogate(logp, logp.detach(), advantages[:, None].expand_as(logp))
        loss = losses.aggregate_loss(per_token, response_mask, mode, max_len=max_len)
        loss.backward()
        grad_norm = torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters() if p.grad is not None))
        results[mode] = {"loss": float(loss.detach()), "grad_norm": float(grad_norm)}
    model.zero_grad(set_to_none=True)
    return results
