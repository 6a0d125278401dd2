"""nb20_kl_gradient: metrics(), the figure, the printed lines and the off-policy gradient explorer."""

import math

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.experiments.checkpoints import load
from workbench.pitfalls import nb20_kl_gradient as kg
from workbench.tasks import rl_problems


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
    fig = kg.figure_kl_gradients(kg.expected_gradients(*small), tiny, on_policy, off_policy, sample_sizes, mc)
    assert len(fig.axes) == 4 and "4 contexts" in fig.axes[1].get_title()
    assert drew(fig)
    assert {t.get_text() for t in fig.legends[0].get_texts()} == {"exact ∇KL", *map(kg.variant_label, kg.VARIANTS)}
    assert "(4 contexts)" in kg.caption_note(on_policy, 4, 6)
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


PROMPTS = [p.prompt for p in rl_problems(32)]


def test_p20_exact_kl_gradient_of_a_three_token_softmax_by_hand():
    from workbench.pitfalls import nb20_kl_gradient as kg

    theta = torch.zeros(3, dtype=torch.float64)  # π = [1/3, 1/3, 1/3]
    ref = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64).log()  # π_ref = [1/6, 2/6, 3/6]
    r = torch.tensor([math.log(2), 0.0, math.log(2 / 3)], dtype=torch.float64)
    kl = float(r.mean())
    assert float(kg.exact_kl(theta, ref)) == pytest.approx(kl, abs=1e-12)
    expected = ((r - kl) / 3).tolist()  # π_j (r_j − KL) = [0.19908, −0.03196, −0.16712]
    assert kg.exact_kl_gradient(theta, ref).tolist() == pytest.approx(expected, abs=1e-12)
    leaf = theta.clone().requires_grad_(True)
    assert torch.autograd.grad(kg.exact_kl(leaf, ref), leaf)[0].tolist() == pytest.approx(expected, abs=1e-12)
    assert kg.expected_gradient(theta, ref, "k1 in loss").abs().max() < 1e-15  # no gradient at all
    for variant in ("k2 in loss", "k1 in reward", "w·k1 in reward", "w·k3 in loss"):
        assert kg.expected_gradient(theta, ref, variant).tolist() == pytest.approx(expected, abs=1e-12), variant
    # k3 in the loss: the gradient of the forward KL(π_ref ‖ π), which is π − π_ref on the logits
    assert kg.expected_gradient(theta, ref, "k3 in loss").tolist() == pytest.approx([1 / 6, 0.0, -1 / 6], abs=1e-12)
    with pytest.raises(ValueError, match="unknown variant"):
        kg.expected_gradient(theta, ref, "k4 in loss")


def test_p20_off_policy_needs_the_importance_weight():
    from workbench.pitfalls import nb20_kl_gradient as kg

    theta, ref = kg.small_softmax(8, seed=1)
    old = theta + 0.3 * torch.randn(8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    rows = kg.compare(theta, ref, sampling_logits=old)
    assert rows["k2 in loss"]["relative_error"] > 0.01 and rows["k1 in reward"]["relative_error"] > 0.01
    assert rows["w·k1 in reward"]["relative_error"] < 1e-10 and rows["w·k3 in loss"]["relative_error"] < 1e-10


def test_p20_monte_carlo_bias_floor_vs_unbiased_decay():
    from workbench.pitfalls import nb20_kl_gradient as kg

    theta, ref = kg.small_softmax(6)
    k1_reward = kg.monte_carlo_error(theta, ref, "k1 in reward", [4, 4096], trials=10)
    k3_loss = kg.monte_carlo_error(theta, ref, "k3 in loss", [4, 4096], trials=10)
    assert k1_reward[1] < 0.1 < k1_reward[0] and k3_loss[1] > 0.3  # 1/√N decay vs the forward-KL floor


def test_p20_tiny_model_next_token_distributions(qwen):
    from workbench.pitfalls import nb20_kl_gradient as kg

    policy, tokenizer = qwen
    reference, _ = load("tiny-arith-gpt2")
    theta = kg.next_token_logits(policy, tokenizer, PROMPTS[:8])
    ref = kg.next_token_logits(reference, tokenizer, PROMPTS[:8])
    on = kg.compare(theta, ref)
    off = kg.off_policy_sweep(theta, ref, [0.2])[0]
    assert on["k1 in loss"]["norm_ratio"] < 1e-10 and on["k3 in loss"]["relative_error"] > 0.1
    assert off["k2 in loss"]["relative_error"] > 0.01
    assert kg.verdict(on, off) == (True, True)


def test_p20_verdict_says_false_on_bug_absent_numbers():
    from workbench.pitfalls.nb20_kl_gradient import VARIANTS, verdict

    exact = {v: {"relative_error": 0.0, "norm_ratio": 1.0, "cosine": 1.0} for v in VARIANTS}
    assert verdict(exact, exact) == (False, True)
    biased_off = {**exact, "w·k3 in loss": {"relative_error": 0.2, "norm_ratio": 1.0, "cosine": 0.9}}
    assert verdict(exact, biased_off)[1] is False
