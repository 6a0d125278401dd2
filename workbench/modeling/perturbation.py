"""Policies a known distance from their reference: seeded Gaussian noise added to every parameter.

The KL and ratio diagnostics need a policy that differs from its reference by a controlled amount,
without training; the same ``seed`` gives the same noise.
"""

from __future__ import annotations

import copy

import torch


@torch.no_grad()
def perturb_(model, scale: float, seed: int = 0):
    """Add ``scale`` × N(0, 1) noise to every parameter of ``model`` in place (a fixed ``seed``
    gives the same noise), and return the model: a policy a known distance from its reference."""
    generator = torch.Generator().manual_seed(seed)
    for parameter in model.parameters():
        noise = torch.randn(parameter.shape, generator=generator)
        parameter.add_((scale * noise).to(device=parameter.device, dtype=parameter.dtype))
    return model


def perturbed_copy(model, scale: float, seed: int = 0):
    """A deep copy of ``model`` with ``perturb_`` noise; the original is untouched."""
    return perturb_(copy.deepcopy(model), scale, seed)
