"""nb46_clip_higher_noop: the PPO surrogate with a detached ratio (the bug) vs stored old log-probs (the fix) against
hand-computed values; gated vs ungated clip fractions; the epochs' verdict both ways; figures, explorer, metrics."""

import math

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.pitfalls import nb46_clip_higher_noop as ch

CLIP = {"clip_low": 0.2, "clip_high": 0.28}


def _loss_and_grad(logp_value: float, old_value: float, advantage: float, ratio: str):
    logp = torch.tensor([math.log(logp_value)], requires_grad=True)
    loss, rho = ch.surrogate(logp, torch.tensor([math.log(old_value)]), torch.tensor([advantage]), ratio=ratio, **CLIP)
    loss.backward()
    return float(loss.detach()), float(logp.grad), float(rho.detach())


def test_surrogate_by_hand():
    # π = 0.5, π_old = 0.25: ρ = 2. A > 0: the fix clips at 1 + 0.28 (loss −1.28, no gradient); the bug sees ρ = 1.
    assert _loss_and_grad(0.5, 0.25, 1.0, "old") == pytest.approx((-1.28, 0.0, 2.0))
    assert _loss_and_grad(0.5, 0.25, 1.0, "detached") == pytest.approx((-1.0, -1.0, 1.0))
    # A < 0 with ρ = 2: not clipped (PPO's min keeps the larger loss ρ·|A|): loss 2, d loss / d logp = ρ = 2.
    assert _loss_and_grad(0.5, 0.25, -1.0, "old") == pytest.approx((2.0, 2.0, 2.0))
    # ρ = 0.5, A < 0: clipped at 1 − 0.2 (loss 0.8, no gradient); the bug: loss 1, gradient 1.
    assert _loss_and_grad(0.25, 0.5, -1.0, "old") == pytest.approx((0.8, 0.0, 0.5))
    assert _loss_and_grad(0.25, 0.5, -1.0, "detached") == pytest.approx((1.0, 1.0, 1.0))
    # θ = θ_old: both ratios give the same loss and gradient.
    assert _loss_and_grad(0.3, 0.3, 0.7, "old") == pytest.approx(_loss_and_grad(0.3, 0.3, 0.7, "detached"))
    with pytest.raises(ValueError, match="ratio must be one of"):
        ch.surrogate(torch.zeros(1), torch.zeros(1), torch.ones(1), ratio="new", **CLIP)


def test_clip_fractions_gated_by_the_advantage_sign():
    rho = torch.tensor([2.0, 2.0, 0.5, 0.5, 1.0])
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0])
    f = ch.clip_fractions(rho, adv, **CLIP)
    assert f == pytest.approx({"high": 0.2, "low": 0.2, "gated": 0.4, "band": 0.8})


def test_epochs_bug_and_fix():
    rows = ch.seed_runs([0], n_sequences=16, length=8, vocab=16, n_contexts=16, epochs=5, lr=0.08, **CLIP)
    head = ch.headline(rows)
    assert head["bug_seen_clip"] == 0.0 and head["bug_true_clip"] > 0.1 and head["bug_clip_higher_effect"] == 0.0
    assert head["fix_clip"] > 0.1 and head["fix_clip_higher_effect"] > 0 and head["fix_seen_equals_true"]
    assert head["first_epoch_gap"] < 1e-6 and head["gradient_gap"] > 0.05
    assert ch.verdict(head) == (True, True)
    # too few / too small updates: the true ratio never leaves the band — nothing to reproduce
    quiet = ch.headline(ch.seed_runs([0], n_sequences=16, length=8, vocab=16, n_contexts=16, epochs=2, lr=0.01, **CLIP))
    assert quiet["bug_true_clip"] == 0.0 and ch.verdict(quiet) == (False, True)
    assert ch.verdict({**head, "fix_seen_equals_true": False})[1] is False


def test_metrics_figures_lines_and_explorer():
    from workbench.viz import legibility

    rows = ch.seed_runs([0, 1], n_sequences=16, length=8, vocab=16, n_contexts=16, epochs=5, lr=0.08, **CLIP)
    head = ch.headline(rows)
    kwargs = ch.metrics(rows, head, {})
    check_metrics(kwargs, "46_clip_higher_noop")
    assert kwargs["reproduced"] and kwargs["fixed"] and kwargs["headline"]["bug"] == 0.0 and kwargs["headline"]["fix"] > 0
    fig = ch.figure_clip_higher(rows, 0.28)
    assert drew(fig) and fig.get_size_inches()[0] <= 9.6 and legibility.check_figure(fig).problems() == []
    assert len(ch.epoch_lines(rows).splitlines()) == 5 and ch.headline_sentence(head).endswith("the fix sees the true clip fraction.")
    assert "16 contexts" in ch.clip_higher_note(16, 8, 16, 16, 0.08, 0.2, 0.28)
    explorer = ch.clip_explorer(n_sequences=8, length=4, vocab=8, epochs=4)
    assert explorer.renders == 1
    explorer.controls["lr"].value = 0.2
    assert explorer.renders == 2 and explorer.last["bug_seen_clip"] == 0.0 and explorer.last["fix_clip"] > 0
