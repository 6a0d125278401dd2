"""Attention back-ends: which implementation a model runs (``sdpa``, ``eager``, ``flash_attention_2``).

``"auto"`` picks flash-attention where it can run (a CUDA GPU with the flash-attn package) and
``sdpa`` elsewhere; asking for flash-attention where it cannot run is an error that says why, rather
than a silent fallback (right padding under flash-attention is pitfall P2).
"""

from __future__ import annotations

import importlib.util

import torch

from workbench.core.errors import AttentionBackendUnavailable

ATTN_IMPLEMENTATIONS = ("auto", "sdpa", "eager", "flash_attention_2")


def flash_attention_status() -> tuple[bool, str]:
    """Whether flash_attention_2 can run here, and the reason when it cannot."""
    if not torch.cuda.is_available():
        return False, "flash-attention needs a CUDA GPU and this machine has none"
    if importlib.util.find_spec("flash_attn") is None:
        return False, "the flash-attn package is not installed (pip install -e '.[gpu]' on a CUDA machine)"
    return True, "flash-attn is installed and CUDA is available"


def resolve_attn_implementation(requested: str = "auto") -> str:
    """Map ``"auto"`` to ``flash_attention_2`` where it can run, else ``sdpa``; validate the rest."""
    if requested not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"attn_implementation={requested!r} is not one of {ATTN_IMPLEMENTATIONS}")
    available, reason = flash_attention_status()
    if requested == "auto":
        return "flash_attention_2" if available else "sdpa"
    if requested == "flash_attention_2" and not available:
        raise AttentionBackendUnavailable(
            f"attn_implementation='flash_attention_2' cannot run: {reason}. "
            "Use attn_implementation='sdpa' (or 'auto', which falls back to sdpa)."
        )
    return requested
