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
from workbench.modeling.perturbation import perturbed_copy
from workbench.trainers.realistic_chat import resolve


def load(name_or_path: str | Path, **options):
    """``(model, tokenizer)`` for a built-in name (``tiny-*``, ``tiny-arith-*``, ``realistic-<flavour>[-chat]``)
    or a local Hugging Face checkpoint folder; ``options`` are ``modeling.models.load_checkpoint``'s (``dtype``,
    ``attn_implementation``, ``device``, ``pad_token``, ``allow_pad_equal_eos``, ``verbose``)."""
    return load_checkpoint(resolve(str(name_or_path)), **options)


load.__signature__ = inspect.signature(load_checkpoint)  # the same keyword arguments, shown by help() and editors


REFERENCE_DRIFT = 0.02  # weight noise of the default reference: KL(policy ‖ reference) ≈ 0.1 nats on the tiny models


def load_reference(reference_model: str | None, policy, *, seed: int = 0, **options):
    """The reference model a notebook compares ``policy`` with: ``reference_model`` loaded with ``load``,
    or, when it is ``None`` ("same as model"), the policy's own checkpoint with ``REFERENCE_DRIFT`` × N(0, 1)
    noise on every weight (``perturbed_copy``) — a policy that has drifted from its reference by a known
    amount, with the same tokenizer by construction."""
    if reference_model is None:
        return perturbed_copy(policy, REFERENCE_DRIFT, seed=seed)
    reference, _ = load(reference_model, **options)
    return reference
