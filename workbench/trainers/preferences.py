"""Preference batches: pairs ``(prompt, chosen, rejected)`` as 2B right-padded rows, the loss mask over
their targets, and the summed log-probs a preference loss compares.

Chosen rows (0..B−1) sit on top of rejected rows (B..2B−1). ``build_loss_mask`` builds the mask the way
OpenRLHF's ``_get_batch_logps`` did, with pitfall S4's switch ``prompt_mask``: ``"both"`` masks every row's
prompt (the fix), ``"chosen_only"`` zips 2B rows with B prompt lengths so the rejected rows keep their
prompt tokens (the bug), ``"none"`` counts prompts on both sides. One home for the DPO trainer, the
held-out pair evaluation, the S4 diagnostics and the TRL host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.core import losses
from workbench.core.batching import pad_sequences
from workbench.modeling.scoring import shared_prefix_token_logprobs, token_logprobs

PROMPT_MASK_MODES = ("both", "chosen_only", "none")


@dataclass
class PreferenceBatch:
    """2B right-padded rows: chosen (rows 0..B−1) on top of rejected (rows B..2B−1)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_lengths: list[int]  # B entries: tokens of each pair's prompt, BOS included

    @property
    def num_pairs(self) -> int:
        return len(self.prompt_lengths)

    def to(self, device) -> PreferenceBatch:
        return PreferenceBatch(self.input_ids.to(device), self.attention_mask.to(device), self.prompt_lengths)


def encode_pairs(tokenizer, pairs: list[dict]) -> list[tuple[list[int], list[int], list[int]]]:
    """``(prompt, prompt+chosen, prompt+rejected)`` token ids of every pair, ``<bos> prompt response <eos>``, in three
    batched tokenizer calls (prompts, chosen, rejected): the ids three calls per pair give (tests/trainers/
    test_speed_paths.py), a fraction of the per-call cost."""
    if not pairs:
        return []
    prompts = tokenizer([p["prompt"] for p in pairs])["input_ids"]
    chosen = tokenizer([p["chosen"] for p in pairs], add_special_tokens=False)["input_ids"]
    rejected = tokenizer([p["rejected"] for p in pairs], add_special_tokens=False)["input_ids"]
    eos = [tokenizer.eos_token_id]
    return [(list(prompt), list(prompt) + list(c) + eos, list(prompt) + list(r) + eos)
            for prompt, c, r in zip(prompts, chosen, rejected, strict=True)]


def collate_encoded(encoded: list[tuple[list[int], list[int], list[int]]], pad_token_id: int) -> PreferenceBatch:
    """Stack encoded pairs (``encode_pairs``) right-padded: chosen rows on top of rejected rows."""
    input_ids, attention_mask = pad_sequences([e[1] for e in encoded] + [e[2] for e in encoded], pad_token_id, side="right")
    return PreferenceBatch(input_ids, attention_mask, [len(e[0]) for e in encoded])


def collate_preferences(tokenizer, pairs: list[dict]) -> PreferenceBatch:
    """Tokenise pairs as ``<bos> prompt response <eos>`` and stack chosen on top of rejected."""
    return collate_encoded(encode_pairs(tokenizer, pairs), tokenizer.pad_token_id)


def build_loss_mask(attention_mask: torch.Tensor, prompt_lengths: list[int], prompt_mask: str) -> torch.Tensor:
    """The per-token loss mask over *targets* (shape (2B, T−1)), built the way OpenRLHF did."""
    loss_masks = attention_mask.clone().bool()
    if prompt_mask == "both":
        row_prompt_lengths = prompt_lengths * 2  # the fix: one length per row
    elif prompt_mask == "chosen_only":
        row_prompt_lengths = prompt_lengths  # the bug: B lengths for 2B rows
    elif prompt_mask == "none":
        row_prompt_lengths = []
    else:
        raise ValueError(f"prompt_mask={prompt_mask!r}; choose one of {PROMPT_MASK_MODES}")
    for mask, source_len in zip(loss_masks, row_prompt_lengths, strict=False):  # zip stops at the shorter list
        mask[:source_len] = False
    return loss_masks[:, 1:]


def prompt_target_mask(attention_mask: torch.Tensor, prompt_lengths: list[int]) -> torch.Tensor:
    """Targets that are prompt tokens (positions 1..L−1 of each row), shape (2B, T−1)."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)[None]
    lengths = torch.tensor(prompt_lengths * 2, device=attention_mask.device)[:, None]
    return ((positions < lengths) & attention_mask.bool())[:, 1:]


def summed_logprobs(model, batch: PreferenceBatch, loss_mask: torch.Tensor, *, position_ids: str = "mask", packed: bool = False,
                    share_prompts: bool = False):
    """Log-probs summed under ``loss_mask`` per row (2B,), and the per-token log-probs (2B, T−1).
    ``share_prompts``: a pair's prompt runs once for both rows (``scoring.shared_prefix_token_logprobs``)."""
    per_token = None
    if share_prompts and position_ids == "mask" and not packed:
        b = batch.num_pairs
        per_token = shared_prefix_token_logprobs(model, batch.input_ids, batch.attention_mask, [[i, i + b] for i in range(b)],
                                                 batch.prompt_lengths)
    if per_token is None:
        per_token = token_logprobs(model, batch.input_ids, batch.attention_mask, position_ids=position_ids, packed=packed)
    return losses.masked_sum(per_token, loss_mask, dim=-1), per_token
