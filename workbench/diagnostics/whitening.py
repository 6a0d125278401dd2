"""Pitfall P13: whitening advantages or rewards over padded positions.

``(x − x.mean()) / x.std()`` over a padded (B, T) tensor counts every pad as a real value: the
mean and std move with the amount of padding, so the real tokens' whitened values are neither
centred nor unit-scaled, and shorter batches are whitened differently from longer ones.
``workbench.losses.masked_whiten`` uses real tokens only.
"""

from __future__ import annotations

import torch

from workbench.losses import masked_mean, masked_var, masked_whiten, naive_whiten


def real_token_stats(whitened: torch.Tensor, mask: torch.Tensor) -> dict:
    """Mean and std of the whitened values over real tokens (should be 0 and 1)."""
    return {"mean": float(masked_mean(whitened, mask)), "std": float(masked_var(whitened, mask).sqrt())}


def whitening_vs_padding(values: torch.Tensor, mask: torch.Tensor, extra_pads: list[int]) -> list[dict]:
    """Real-token statistics after naive and masked whitening as padding columns are added."""
    rows = []
    for extra in extra_pads:
        padded_values = torch.cat([values, torch.zeros(values.shape[0], extra)], 1)
        padded_mask = torch.cat([mask, torch.zeros(mask.shape[0], extra, dtype=mask.dtype)], 1)
        naive = real_token_stats(naive_whiten(padded_values) * padded_mask, padded_mask)
        masked = real_token_stats(masked_whiten(padded_values, padded_mask), padded_mask)
        rows.append({"extra_pads": extra, "padding_fraction": 1 - float(padded_mask.float().mean()),
                     "naive_mean": naive["mean"], "naive_std": naive["std"], "masked_mean": masked["mean"], "masked_std": masked["std"]})
    return rows
