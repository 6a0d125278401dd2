"""Dropout switched off everywhere a model keeps it: modules, attention attributes and the config.

The fix for pitfall P7: with dropout on, two forwards of the same weights disagree, so the first-step
importance ratio is not 1 and the KL to an identical reference is not 0.
"""

from __future__ import annotations

import torch

DROPOUT_CONFIG_FIELDS = ("attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout",
                         "hidden_dropout_prob", "attention_probs_dropout_prob", "dropout")


def disable_dropout(model) -> int:
    """Set every dropout probability of ``model`` to 0 (modules, attention attributes, config).

    Returns how many dropout sites were switched off.
    """
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout) and module.p > 0:
            module.p = 0.0
            changed += 1
        if isinstance(getattr(module, "attention_dropout", None), float) and module.attention_dropout > 0:
            module.attention_dropout = 0.0
            changed += 1
    config = getattr(model, "config", None)
    for field in DROPOUT_CONFIG_FIELDS:
        if config is not None and isinstance(getattr(config, field, None), float):
            setattr(config, field, 0.0)
    return changed
