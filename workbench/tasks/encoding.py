"""Between text and tokens for the task: left-padded prompts for sampling, responses with EOS,
and rewards computed from the decoded response text (so any tokenizer works, BPE included)."""

from __future__ import annotations

import torch

from workbench.batching import pad_sequences
from workbench.tasks.arithmetic import Problem, reward


def encode_prompts(tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``(ids, mask)`` with BOS, ready for sampling."""
    rows = [tokenizer(p, add_special_tokens=True)["input_ids"] for p in prompts]
    return pad_sequences(rows, tokenizer.pad_token_id, side="left")


def encode_response(tokenizer, text: str, add_eos: bool = True) -> list[int]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids + [tokenizer.eos_token_id] if add_eos else ids


def decode_responses(tokenizer, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    """Response text without special tokens (EOS and pads dropped)."""
    rows = zip(response_ids, response_mask, strict=True)
    return [tokenizer.decode(row[mask.bool()].tolist(), skip_special_tokens=True) for row, mask in rows]


def score_responses(tokenizer, problems: list[Problem], response_ids, response_mask, finished) -> torch.Tensor:
    """Task rewards (B,) for a batch of responses."""
    texts = decode_responses(tokenizer, response_ids, response_mask)
    return torch.tensor([reward(t, bool(f), p) for t, f, p in zip(texts, finished, problems, strict=False)], dtype=torch.float32)
