"""Pitfall S2: right padding, Qwen2 + flash-attention, and padding-free batches.

After sampling, a PPO actor marks everything after EOS as padding: rows that stopped early end
in zeros, so the batch is *right*-padded. transformers 4.37.0–4.41.2 ``Qwen2Model.forward``
refused such batches with flash_attention_2 whenever ``use_cache`` was true (the config default,
so training forwards hit it too)::

    is_padding_right = attention_mask[:, -1].sum().item() != batch_size
    → ValueError("You are attempting to perform batched generation with padding_side='right' ...")

The check guarded a real hazard that is silent today: in batched *cached generation* a
right-padded row's new tokens are appended after its pads, so its continuation is predicted from
a pad position and differs from generating that row alone. Left padding (with mask-derived
position ids) is exact; for training forwards, padding-free packing avoids padding altogether.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from workbench.batching import pad_sequences, padding_side_of
from workbench.rollout import truncate_after_eos
from workbench.errors import RightPaddingError  # noqa: F401  (re-exported)

TRANSFORMERS_MESSAGE = (
    "You are attempting to perform batched generation with padding_side='right' this may lead to unexpected "
    "behaviour for Flash Attention version of Qwen2. Make sure to  call `tokenizer.padding_side  = 'left'` "
    "before tokenizing the input."
)


@dataclass
class PaddingReport:
    padding_side: str
    """``left``, ``right``, ``none`` or ``mixed`` (see ``batching.padding_side_of``)."""
    right_padded: bool
    """transformers' own test: some row's last column is padding (``mask[:, -1].sum() != B``)."""
    rows_ending_in_padding: list[int]
    would_raise_in_transformers_4_37_to_4_41: bool
    """Qwen2 + flash_attention_2 + use_cache + right padding: the old ValueError."""

    def __str__(self) -> str:
        verdict = "would raise" if self.would_raise_in_transformers_4_37_to_4_41 else "passes"
        return (f"padding={self.padding_side}, right-padded={self.right_padded} "
                f"(rows {self.rows_ending_in_padding[:8]}{'…' if len(self.rows_ending_in_padding) > 8 else ''}); "
                f"transformers 4.37–4.41 Qwen2 flash-attention check: {verdict}")


def padding_guard(
    attention_mask: torch.Tensor, *, use_cache: bool = True, attn_implementation: str = "flash_attention_2", model_type: str = "qwen2"
) -> PaddingReport:
    """Classify a batch's padding and say whether the old Qwen2 flash-attention check would fire."""
    last_column = attention_mask[:, -1]
    right_padded = bool(last_column.sum().item() != attention_mask.shape[0])
    return PaddingReport(
        padding_side=padding_side_of(attention_mask),
        right_padded=right_padded,
        rows_ending_in_padding=torch.nonzero(last_column == 0).flatten().tolist(),
        would_raise_in_transformers_4_37_to_4_41=(
            right_padded and use_cache and attn_implementation == "flash_attention_2" and model_type == "qwen2"
        ),
    )


def assert_not_right_padded(attention_mask: torch.Tensor, *, use_cache: bool = True) -> None:
    """Raise ``RightPaddingError`` on a right-padded batch when a cache is in use (drop-in assertion)."""
    report = padding_guard(attention_mask, use_cache=use_cache)
    if report.right_padded and use_cache:
        raise RightPaddingError(
            f"{TRANSFORMERS_MESSAGE} ({report}). Left-pad prompts for generation, or score with use_cache=False "
            "(or padding-free packed batches) for training forwards."
        )


@torch.no_grad()
def greedy_continuations(model, tokenizer, prompts: list[str], *, side: str, max_new_tokens: int) -> list[list[int]]:
    """Greedy, cached, batched ``generate`` with prompts padded on ``side``; continuations cut after EOS."""
    rows = [tokenizer(p)["input_ids"] for p in prompts]
    ids, mask = pad_sequences(rows, tokenizer.pad_token_id, side=side)
    out = model.generate(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, use_cache=True,
    )
    continuation, keep = truncate_after_eos(out[:, ids.shape[1]:], tokenizer.eos_token_id, tokenizer.pad_token_id)
    return [row[k.bool()].tolist() for row, k in zip(continuation, keep)]


def generation_divergence(model, tokenizer, prompts: list[str], *, max_new_tokens: int = 6) -> dict:
    """How many rows' greedy continuations differ from generating each row alone, per padding side."""
    alone = [greedy_continuations(model, tokenizer, [p], side="left", max_new_tokens=max_new_tokens)[0] for p in prompts]
    result = {"rows": len(prompts), "alone": alone}
    for side in ("left", "right"):
        batched = greedy_continuations(model, tokenizer, prompts, side=side, max_new_tokens=max_new_tokens)
        result[f"{side}_divergent_rows"] = sum(a != b for a, b in zip(alone, batched))
        result[side] = batched
    return result


def scoring_throughput(model, sequences: list[list[int]], *, packed: bool, pad_token_id: int, repeats: int = 5) -> float:
    """Real tokens scored per second (median of ``repeats``), padded (right) or packed."""
    from workbench.scoring import token_logprobs

    ids, mask = pad_sequences(sequences, pad_token_id, side="right")
    real_tokens = int(mask.sum())
    times = []
    with torch.no_grad():
        token_logprobs(model, ids, mask, packed=packed)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            token_logprobs(model, ids, mask, packed=packed)
            times.append(time.perf_counter() - start)
    return real_tokens / sorted(times)[len(times) // 2]
