"""Pitfall S4: the DPO loss mask that covered only the chosen prompts.

OpenRLHF's ``concatenated_forward`` stacks B chosen rows on B rejected rows and masked prompts
with ``for mask, source_len in zip(loss_masks, prompt_id_lens): mask[:source_len] = False``.
``loss_masks`` had 2B rows but ``prompt_id_lens`` B entries: ``zip`` stopped after B rows, so the
rejected log-probs still summed their prompt tokens. The margin then gains
−β[log π(prompt) − log π_ref(prompt)] from the rejected side only: 0 at step 0 (π = π_ref),
then a gradient that lowers the prompt's likelihood and inflates margins and accuracies with
something that is not preference.

``check_prompt_lengths`` raises on the count mismatch that caused it; ``audit_loss_mask`` lists
every row whose prompt tokens are counted; ``margin_decomposition`` splits the margin.
"""

from __future__ import annotations

import torch

from workbench.trainers.dpo import PreferenceBatch, build_loss_mask, prompt_target_mask, summed_logprobs
from workbench.errors import PromptMaskError  # noqa: F401  (re-exported)


def check_prompt_lengths(num_rows: int, prompt_lengths: list[int]) -> None:
    """Raise unless there is one prompt length per row (pass the per-row list, e.g. ``lengths * 2``)."""
    if len(prompt_lengths) != num_rows:
        raise PromptMaskError(
            f"{len(prompt_lengths)} prompt lengths for {num_rows} loss-mask rows: zip() would silently stop after "
            f"{min(len(prompt_lengths), num_rows)} rows and leave the rest of the prompts in the loss. For a "
            "concatenated chosen+rejected batch pass `prompt_lengths * 2`."
        )


def audit_loss_mask(input_ids: torch.Tensor, loss_mask: torch.Tensor, prompt_lengths: list[int]) -> list[dict]:
    """Every row whose loss mask (over targets, (2B, T−1)) counts prompt tokens.

    ``prompt_lengths`` has one entry per *pair*; rows 0..B−1 are chosen, B..2B−1 rejected.
    """
    rows = input_ids.shape[0]
    if rows != 2 * len(prompt_lengths):
        raise PromptMaskError(f"{rows} rows but {len(prompt_lengths)} pairs: expected 2 rows per pair")
    attention_mask = torch.ones_like(input_ids)
    prompt_targets = prompt_target_mask(attention_mask, prompt_lengths)
    counted = (loss_mask.bool() & prompt_targets).sum(-1)
    b = len(prompt_lengths)
    return [
        {"row": i, "side": "chosen" if i < b else "rejected", "pair": i % b, "prompt_tokens_in_loss": int(n)}
        for i, n in enumerate(counted.tolist())
        if n > 0
    ]


@torch.no_grad()
def margin_decomposition(policy, reference, batch: PreferenceBatch, beta: float) -> dict:
    """Margins h·β under each mask mode, and the rejected-side prompt term that separates them.

    Returns per-pair tensors: ``margin_both`` (response tokens only), ``margin_chosen_only``,
    and ``rejected_prompt_term`` = −β[log π(prompt) − log π_ref(prompt)] of the rejected rows,
    with ``margin_chosen_only = margin_both + rejected_prompt_term`` exactly.
    """
    b = batch.num_pairs
    out = {}
    for mode in ("both", "chosen_only"):
        mask = build_loss_mask(batch.attention_mask, batch.prompt_lengths, mode)
        pol, _ = summed_logprobs(policy, batch, mask)
        ref, _ = summed_logprobs(reference, batch, mask)
        out[f"margin_{mode}"] = beta * ((pol[:b] - ref[:b]) - (pol[b:] - ref[b:]))
    prompt = prompt_target_mask(batch.attention_mask, batch.prompt_lengths)
    pol_prompt, _ = summed_logprobs(policy, batch, prompt)
    ref_prompt, _ = summed_logprobs(reference, batch, prompt)
    out["rejected_prompt_term"] = -beta * (pol_prompt[b:] - ref_prompt[b:])
    return out
