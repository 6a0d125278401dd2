"""``load``: any checkpoint by name or folder, the one call notebooks, the command line and the comparisons use.

``load(name)`` = ``trainers.realistic_chat.resolve(name)`` (a ``realistic-<flavour>-chat`` name is trained
on first use: a few seconds of chat SFT, cached) then ``modeling.models.load_checkpoint`` (the one loader
of Hugging Face folders: built-in names, safetensors only, no remote code, the pad-token policy). It
lives here, above the trainers, because building a chat checkpoint means training and ``modeling``
must not import ``trainers``; it is exported as ``workbench.load``.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from workbench.modeling.models import load_checkpoint
from workbench.trainers.realistic_chat import resolve


def load(name_or_path: str | Path, **options):
    """``(model, tokenizer)`` for a built-in name (``tiny-*``, ``tiny-arith-*``, ``realistic-<flavour>[-chat]``)
    or a local Hugging Face checkpoint folder; ``options`` are ``modeling.models.load_checkpoint``'s (``dtype``,
    ``attn_implementation``, ``device``, ``pad_token``, ``allow_pad_equal_eos``, ``verbose``)."""
    return load_checkpoint(resolve(str(name_or_path)), **options)


load.__signature__ = inspect.signature(load_checkpoint)  # the same keyword arguments, shown by help() and editors
