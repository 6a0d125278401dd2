"""modeling.perturbation: seeded copies that leave the original alone."""

import torch

from workbench.modeling.perturbation import perturbed_copy
from workbench.modeling.tiny import tiny_model


def test_perturbed_copy_is_seeded_and_leaves_the_original():
    model, _ = tiny_model("qwen2", seed=0)
    before = [p.clone() for p in model.parameters()]
    a, b = perturbed_copy(model, 0.01, seed=3), perturbed_copy(model, 0.01, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert any(not torch.equal(p, q) for p, q in zip(a.parameters(), model.parameters(), strict=True))
