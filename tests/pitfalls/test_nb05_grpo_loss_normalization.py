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


def test_figures_are_readable_at_notebook_width():
    from workbench.viz import legibility

    spreads = [1, 2, 4, 8, 16]
    figures = [ln.figure_token_weights(ln.token_weights(spreads)),
               ln.figure_effective_beta(spreads, ln.effective_beta_sweep(spreads, 0.04), 0.04),
               ln.figure_training_bands(fake_runs(MODES, KEYS, seeds=3, steps=30), train_steps=30),
               ln.figure_training_bands(fake_runs(list(losses.LOSS_AGG_MODES), KEYS, seeds=3, steps=30), train_steps=30)]
    for fig in figures:
        assert fig.get_size_inches()[0] <= 9.6
        assert legibility.check_figure(fig).problems() == []


def test_training_figure_draws_bug_and_fix_in_their_colours():
    from workbench.viz import plots

    fig = ln.figure_training_bands(fake_runs(MODES, KEYS), train_steps=4)
    colours = {line.get_label(): line.get_color() for line in fig.axes[0].get_lines()}
    assert colours["seq-mean-token-mean (bug) (n=2)"] == plots.BUG_COLOR and colours["token-mean (fix) (n=2)"] == plots.FIX_COLOR
    assert "bug (vermilion): seq-mean-token-mean, fix (blue): token-mean" in ln.training_note(fake_runs(MODES, KEYS), 4)


def test_explorer_states_a_constant_weight_on_a_linear_axis():
    import matplotlib.pyplot as plt

    ln.loss_mode_explorer()  # token-mean: every token the same weight, every response a different one
    token_axis, response_axis = plt.gcf().axes
    assert token_axis.get_yscale() == "linear" and "at every length" in token_axis.get_title()
    assert response_axis.get_yscale() == "log" and not response_axis.get_title()


def test_probe_note_says_zero_up_to_rounding_only_within_the_verdicts_tolerance():
    probe = {"token-mean": {"loss": 0.11, "grad_norm": 10.3}, "seq-mean-token-mean": {"loss": -2.98e-8, "grad_norm": 14.2}}
    note = ln.probe_note(probe)
    assert "0 up to float rounding" in note and "no mode's update is 0" in note
    probe["seq-mean-token-mean"]["loss"] = 3e-6
    assert "not 0" in ln.probe_note(probe)
