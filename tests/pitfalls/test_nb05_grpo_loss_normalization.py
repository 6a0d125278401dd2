"""nb05_grpo_loss_normalization: metrics(), figures, the weight check and the loss-mode explorer."""

import pytest
from pitfall_fakes import axes, check_metrics, drew, fake_runs

from workbench.core import losses
from workbench.pitfalls import nb05_grpo_loss_normalization as ln
from workbench.pitfalls import nb05_grpo_loss_normalization as loss_normalization

MODES = ["token-mean", "seq-mean-token-mean"]
KEYS = ("reward", "length_correct", "length_incorrect")


def test_metrics_returns_write_metrics_arguments():
    probe = {m: {"loss": 0.0 if m == "seq-mean-token-mean" else 0.2, "grad_norm": 1.0} for m in losses.LOSS_AGG_MODES}
    effective = ln.effective_beta_sweep([1, 4], 0.04)
    runs = fake_runs(MODES, KEYS)
    kwargs = ln.metrics(probe=probe, weight_error=0.0, effective=effective, beta=0.04, runs=runs,
                        effects=ln.training_effects(runs, MODES), settings={}, task="sums")
    check_metrics(kwargs, "05_grpo_loss_normalization")
    assert kwargs["headline"]["bug"] == 0.2 and kwargs["headline"]["fix"] == 0.0
    assert set(kwargs["metrics"]["training"]) == set(MODES)
    assert set(kwargs["metrics"]["training_effects"]) == {"length_incorrect", "reward", "heldout_accuracy"}


def test_analytic_token_weights_match_autograd():
    assert ln.token_weight_error(ln.token_weights([1, 2, 4])) < 1e-6


def test_figures_draw():
    assert drew(ln.figure_token_weights(ln.token_weights([1, 2, 4])))
    assert drew(ln.figure_effective_beta([1, 4], ln.effective_beta_sweep([1, 4], 0.04), 0.04))
    assert drew(ln.figure_training_bands(fake_runs(MODES, KEYS), train_steps=4))
    fig, ax = axes(4)
    ln.plot_training_bands(ax, fake_runs(MODES, KEYS), window=1)
    assert drew(fig)


def test_loss_mode_explorer_changes_weights_with_the_mode():
    explorer = ln.loss_mode_explorer()
    token_mean = explorer.last["weights"]
    assert len(set(round(w, 12) for w in token_mean)) == 1  # every token the same weight
    explorer.controls["mode"].value = "seq-mean-token-mean"
    assert explorer.last["weights"][0] > explorer.last["weights"][-1]  # short responses weigh more per token


def test_loss_normalisation_verdict_measures_the_trainers_kl_mix():
    probe = {"token-mean": {"loss": 0.11}, "seq-mean-token-mean": {"loss": 0.0}}
    effective = loss_normalization.effective_beta_sweep([1, 4], 0.04)
    assert effective["per_sequence"][1][0] == pytest.approx(0.04 * 5 / 2, rel=1e-5)  # β·mean(L)/L_short, L = 2 and 8
    assert loss_normalization.verdict(probe, effective, 0.04) == (True, True)
    uniform = {"per_sequence": [[0.04, 0.04]], "with_loss": [[0.04, 0.04]]}
    assert loss_normalization.verdict(probe, uniform, 0.04) == (False, True)
    mixed = {"per_sequence": [[0.1, 0.02]], "with_loss": [[0.1, 0.02]]}
    assert loss_normalization.verdict(probe, mixed, 0.04)[1] is False
