"""nb20_kl_gradient: metrics(), the figure, the printed lines and the off-policy gradient explorer."""

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.pitfalls import nb20_kl_gradient as kg


@pytest.fixture(scope="module")
def measured():
    small = kg.small_softmax(6, seed=0)
    g = torch.Generator().manual_seed(1)
    tiny = (torch.randn(4, 8, generator=g, dtype=torch.float64), torch.randn(4, 8, generator=g, dtype=torch.float64))
    on_policy, small_cmp = kg.compare(*tiny), kg.compare(*small)
    off_policy = kg.off_policy_sweep(*tiny, [0.1, 1.0])
    sample_sizes = [4, 64]
    mc = kg.monte_carlo_sweep(*small, sample_sizes, trials=3)
    return small, tiny, on_policy, small_cmp, off_policy, sample_sizes, mc


def test_metrics_returns_write_metrics_arguments(measured):
    _, _, on_policy, small, off_policy, sample_sizes, mc = measured
    kwargs = kg.metrics(on_policy=on_policy, small=small, off_policy=off_policy, sample_sizes=sample_sizes, mc=mc)
    check_metrics(kwargs, "20_kl_gradient")
    assert (kwargs["reproduced"], kwargs["fixed"]) == (True, True)  # two random logit vectors: k3's bias shows, the fixes are exact
    assert kwargs["not_shown"] is None
    assert set(kwargs["metrics"]["monte_carlo_relative_error"]) == set(kg.MONTE_CARLO_VARIANTS)
    assert set(kwargs["metrics"]["monte_carlo_relative_error"]["k1 in loss"]) == {"4", "64"}
    assert kwargs["headline"]["bug"] == on_policy["k3 in loss"]["relative_error"] > 0.05


def test_metrics_say_why_when_the_models_are_too_close(measured):
    _, (theta, _), _, small, _, sample_sizes, mc = measured
    same = kg.compare(theta, theta + 1e-4)  # a reference a hair away: k3 ≈ the KL's gradient
    kwargs = kg.metrics(on_policy=same, small=small, off_policy=kg.off_policy_sweep(theta, theta + 1e-4, [0.1]),
                        sample_sizes=sample_sizes, mc=mc)
    assert not kwargs["reproduced"] and "too close" in kwargs["not_shown"]


def test_figure_and_lines(measured):
    small, tiny, on_policy, small_cmp, off_policy, sample_sizes, mc = measured
    fig = kg.figure_kl_gradients(small, tiny, on_policy, off_policy, sample_sizes, mc)
    assert len(fig.axes) == 4 and "4 contexts" in fig.axes[1].get_title()
    assert drew(fig)
    lines = kg.gradient_lines(small_cmp, on_policy, off_policy, sample_sizes, mc).splitlines()
    assert len(lines) == len(kg.VARIANTS) + 2 and lines[-1].startswith("k1 in the loss gives no gradient")


def test_off_policy_gradient_explorer_redraws_for_the_step(measured):
    _, (theta, ref_logits), *_ = measured
    explorer = kg.off_policy_gradient_explorer(theta, ref_logits, step=0.0)
    assert explorer.renders == 1 and explorer.last["step"] == 0.0
    assert explorer.last["k2 in loss"]["relative_error"] < 1e-9  # on-policy, k2 is exact
    explorer.controls["s"].value = 1.0
    assert explorer.renders == 2 and explorer.last["step"] == 1.0
    assert explorer.last["k2 in loss"]["relative_error"] > 1e-3  # off-policy it is not; the weighted ones stay exact
    assert explorer.last["w·k1 in reward"]["relative_error"] < 1e-9
