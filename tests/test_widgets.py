"""Widget logic without a browser: set a control's value, check what the observer produced.

The explorers of notebooks 00–12 are tested with their pitfall modules in tests/pitfalls/."""

import matplotlib

matplotlib.use("Agg")

from workbench.pitfalls.nb13_whitening import whitening_explorer  # noqa: E402


def test_whitening_explorer():
    import torch

    values = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    explorer = whitening_explorer(values, torch.tensor([[1, 1, 0], [1, 0, 0]]))
    before = explorer.last["naive_mean"]
    explorer.controls["extra"].value = 32
    assert abs(explorer.last["naive_mean"]) > abs(before) and abs(explorer.last["masked_mean"]) < 1e-6
