"""Pitfall P21: two BOS tokens — a chat template that writes BOS, and a tokenizer that adds one.

Llama-3-style chat templates start with ``{{ bos_token }}`` and their tokenizers' post-processor
also prepends BOS. ``apply_chat_template(tokenize=True)`` encodes without special tokens, so its
ids start with one BOS; but the common two-step path — render the text with
``apply_chat_template(tokenize=False)``, then ``tokenizer(text)`` — adds a second one. A policy
trained on one BOS then sees a sequence shifted by one position behind an unexpected token:
log π(response | BOS BOS prompt) ≠ log π(response | BOS prompt). When the rollout engine got one
path and the trainer the other, the importance ratio is not 1 at learning rate 0 and the KL to a
reference scored the other way is not 0 (DeepSeek-R1 #151, NeMo-RL #855).

The fix: encode rendered chat text with ``add_special_tokens=False`` (or pass the template's ids
along), and assert that a sequence starts with exactly one BOS.
"""

from __future__ import annotations

import torch

from workbench.core.batching import pad_sequences
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import response_logprobs

ENCODINGS = ("template ids", "text + tokenizer()", "text + tokenizer(add_special_tokens=False)")


def encode_chat(tokenizer, messages: list[dict], how: str) -> list[int]:
    """Prompt ids (with the generation prompt) by one of the three usual paths in ``ENCODINGS``."""
    if how not in ENCODINGS:
        raise ValueError(f"how={how!r}; use one of {ENCODINGS}")
    if how == "template ids":
        out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=how == "text + tokenizer()")["input_ids"]


def leading_bos(ids: list[int], bos_token_id: int | None) -> int:
    """How many BOS tokens a sequence starts with."""
    count = 0
    while bos_token_id is not None and count < len(ids) and ids[count] == bos_token_id:
        count += 1
    return count


def strip_duplicate_bos(ids: list[int], bos_token_id: int | None) -> list[int]:
    """The guard: keep exactly one leading BOS where there are several."""
    extra = leading_bos(ids, bos_token_id) - 1
    return ids[extra:] if extra > 0 else ids


def bos_audit(tokenizer) -> dict:
    """What a tokenizer and its chat template do about BOS, and the leading-BOS count of each path."""
    bos = tokenizer.bos_token_id
    messages = [{"role": "user", "content": "1+1="}]
    adds_bos = bos is not None and leading_bos(tokenizer("x")["input_ids"], bos) > 0
    audit = {"bos_token": tokenizer.bos_token, "tokenizer_adds_bos": adds_bos,
             "has_chat_template": bool(getattr(tokenizer, "chat_template", None))}
    if audit["has_chat_template"]:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        audit["template_writes_bos"] = tokenizer.bos_token is not None and text.startswith(tokenizer.bos_token)
        audit["leading_bos"] = {how: leading_bos(encode_chat(tokenizer, messages, how), bos) for how in ENCODINGS}
    return audit


def filler_id(tokenizer, avoid: list[int]) -> int:
    """A token id to fill padded positions (always masked) when the tokenizer has no pad token."""
    if tokenizer.pad_token_id is not None:
        return tokenizer.pad_token_id
    for token_id in sorted(tokenizer.added_tokens_decoder):
        if token_id not in avoid:
            return token_id
    raise ValueError("the tokenizer has no pad token and no spare special token to pad with; set tokenizer.pad_token")


@torch.no_grad()
def response_shift(model, tokenizer, prompts: list[str], *, max_new_tokens: int = 12, seed: int = 0,
                   greedy: bool = False) -> dict:
    """Responses sampled from single-BOS prompts (the template's ids, as a rollout engine gets them),
    then scored behind the prompt as each path encodes it: per-token log-ratios to the template-ids
    score at lr 0, and the k1 KL estimate per sequence."""
    stop = model.generation_config.eos_token_id
    stop = [stop] if isinstance(stop, int) else list(stop)
    pad = filler_id(tokenizer, avoid=stop + [tokenizer.bos_token_id])
    prompts_by = {how: [encode_chat(tokenizer, [{"role": "user", "content": p}], how) for p in prompts] for how in ENCODINGS}
    device = model.device
    ids, mask = (t.to(device) for t in pad_sequences(prompts_by["template ids"], pad, side="left"))
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=stop, pad_token_id=pad,
                     generator=torch.Generator(device).manual_seed(seed), greedy=greedy)
    m = rollout.response_mask.bool()
    # π_old as the engine saw it: the same responses behind the template's own ids (teacher-forced).
    reference = response_logprobs(model, ids, mask, rollout.response_ids, rollout.response_mask).float()
    result = {"texts": [tokenizer.decode(r[k]) for r, k in zip(rollout.response_ids, m, strict=True)], "paths": {}}
    for how, rows in prompts_by.items():
        p_ids, p_mask = (t.to(device) for t in pad_sequences(rows, pad, side="left"))
        logp = response_logprobs(model, p_ids, p_mask, rollout.response_ids, rollout.response_mask).float()
        log_ratio = (logp - reference)[m]
        result["paths"][how] = {
            "leading_bos": [leading_bos(r, tokenizer.bos_token_id) for r in rows][0],
            "mean_abs_log_ratio": float(log_ratio.abs().mean()),
            "max_ratio_deviation": float((log_ratio.exp() - 1).abs().max()),
            "sequence_kl_k1": float(-(logp - reference).mul(rollout.response_mask).sum(-1).mean()) + 0.0,  # no "-0.0"
            "log_ratio": log_ratio.cpu(),
        }
    # the guard: stripping the extra BOS recovers the template's ids exactly
    guarded = [strip_duplicate_bos(r, tokenizer.bos_token_id) for r in prompts_by["text + tokenizer()"]]
    result["guard_recovers_template_ids"] = guarded == prompts_by["template ids"]
    return result


@torch.no_grad()
def greedy_answers(model, tokenizer, prompts: list[str], how: str, *, max_new_tokens: int = 8) -> list[str]:
    """Greedy responses (decoded, special tokens dropped) to ``prompts`` encoded by path ``how``."""
    stop = model.generation_config.eos_token_id
    stop = [stop] if isinstance(stop, int) else list(stop)
    pad = filler_id(tokenizer, avoid=stop + [tokenizer.bos_token_id])
    rows = [encode_chat(tokenizer, [{"role": "user", "content": p}], how) for p in prompts]
    ids, mask = (t.to(model.device) for t in pad_sequences(rows, pad, side="left"))
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=stop, pad_token_id=pad, greedy=True)
    return [tokenizer.decode(r[k.bool()], skip_special_tokens=True)
            for r, k in zip(rollout.response_ids, rollout.response_mask, strict=True)]


def not_shown(tokenizer) -> str | None:
    """Why this checkpoint cannot show the pitfall, or None: a tokenizer without a BOS token (Qwen2)
    cannot put two in front of a prompt."""
    if tokenizer.bos_token_id is not None:
        return None
    return "the tokenizer has no BOS token (Qwen2-style), so no prompt can start with two; a Llama-3-like checkpoint shows it"


def verdict(bug: dict, fix: dict, *, signature: float = 1e-3, tolerance: float = 1e-6) -> tuple[bool, bool]:
    """``(reproduced, fixed)`` from two ``response_shift`` path summaries: the bug path starts with
    two BOS and moves the log-probs; the fix path starts with one and moves nothing."""
    reproduced = bug["leading_bos"] >= 2 and bug["mean_abs_log_ratio"] > signature
    fixed = fix["leading_bos"] == 1 and fix["max_ratio_deviation"] <= tolerance
    return reproduced, fixed
