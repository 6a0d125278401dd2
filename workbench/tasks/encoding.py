"""Between text and tokens for the task: left-padded prompts for sampling, responses with EOS,
and rewards computed from the decoded response text (so any tokenizer works, BPE included)."""

from __future__ import annotations

import torch

from workbench.core.batching import pad_sequences
from workbench.tasks.arithmetic import Problem
from workbench.tasks.registry import reward

CHAT_TEMPLATE_MODES = ("auto", "none")


def uses_chat_template(tokenizer, chat_template: str = "auto") -> bool:
    """``"auto"``: prompts go through the tokenizer's chat template when it has one; ``"none"``: never."""
    if chat_template not in CHAT_TEMPLATE_MODES:
        raise ValueError(f"chat_template={chat_template!r}; use one of {CHAT_TEMPLATE_MODES}")
    return chat_template == "auto" and bool(getattr(tokenizer, "chat_template", None))


def prompt_ids(tokenizer, prompt: str, chat_template: str = "auto") -> list[int]:
    """The token ids of one prompt: through the chat template as a user turn with the generation
    prompt (``apply_chat_template(add_generation_prompt=True)``) and encoded *without* special tokens,
    since the template already wrote its BOS (pitfall P21: a second BOS); otherwise the text with the
    tokenizer's own special tokens (a BOS where the tokenizer adds one, none for Qwen2-style ones)."""
    if uses_chat_template(tokenizer, chat_template):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]


def encode_prompts(tokenizer, prompts: list[str], chat_template: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``(ids, mask)``, ready for sampling (see ``prompt_ids``)."""
    rows = [prompt_ids(tokenizer, p, chat_template) for p in prompts]
    return pad_sequences(rows, tokenizer.pad_token_id, side="left")


def encode_response(tokenizer, text: str, add_eos: bool = True) -> list[int]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids + [tokenizer.eos_token_id] if add_eos else ids


def decode_responses(tokenizer, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    """Response text without special tokens (EOS and pads dropped)."""
    rows = zip(response_ids, response_mask, strict=True)
    return [tokenizer.decode(row[mask.bool()].tolist(), skip_special_tokens=True) for row, mask in rows]


def score_responses(tokenizer, problems: list[Problem], response_ids, response_mask, finished) -> torch.Tensor:
    """Task rewards (B,) for a batch of responses, each by its problem's task (``tasks.registry.reward``)."""
    texts = decode_responses(tokenizer, response_ids, response_mask)
    return torch.tensor([reward(t, bool(f), p) for t, f, p in zip(texts, finished, problems, strict=False)], dtype=torch.float32)
