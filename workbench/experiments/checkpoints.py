"""``load``: any checkpoint by name or folder, the one call notebooks, the command line and the comparisons use.

``load(name)`` = ``trainers.realistic_chat.resolve(name)`` (a ``realistic-<flavour>-chat`` name is trained
on first use: a few seconds of chat SFT, cached) then ``modeling.models.load_checkpoint`` (the one loader
of Hugging Face folders: built-in names, safetensors only, no remote code, the pad-token policy). It
lives here, above the trainers, because building a chat checkpoint means training and ``modeling``
must not import ``trainers``; it is exported as ``workbench.load``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from workbench.modeling.models import load_checkpoint
from workbench.trainers.realistic_chat import resolve


def load(
    name_or_path: str | Path,
    *,
    dtype: torch.dtype | None = torch.float32,
    attn_implementation: str = "auto",
    device: str | torch.device = "auto",
    pad_token: str | None = "auto",
    allow_pad_equal_eos: bool = False,
    verbose: bool = False,
):
    """``(model, tokenizer)`` for a built-in name (``tiny-*``, ``tiny-arith-*``, ``realistic-<flavour>[-chat]``)
    or a local Hugging Face checkpoint folder; the arguments are ``modeling.models.load_checkpoint``'s."""
    return load_checkpoint(resolve(str(name_or_path)), dtype=dtype, attn_implementation=attn_implementation, device=device,
                           pad_token=pad_token, allow_pad_equal_eos=allow_pad_equal_eos, verbose=verbose)
