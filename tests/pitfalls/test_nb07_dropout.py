"""nb07_dropout: metrics(), figures and the dropout explorer."""

from pitfall_fakes import axes, check_metrics, drew, fake_runs

from workbench.pitfalls import nb07_dropout as dropout

DROPOUTS = [0.0, 0.1]
RESULTS = {(d, off): {"max_ratio_deviation": 0.0 if off or d == 0 else 0.3, "sequence_kl_k1": 0.0 if off or d == 0 else 0.2}
           for d in DROPOUTS for off in (False, True)}
KEYS = ("train_ratio_deviation", "kl", "reward")


def test_metrics_returns_write_metrics_arguments():
    runs = fake_runs(dropout.PPO_VARIANTS, KEYS)
    kwargs = dropout.metrics(results=RESULTS, dropouts=DROPOUTS, runs=runs, effects=dropout.ppo_effects(runs), settings={})
    check_metrics(kwargs, "07_dropout")
    assert kwargs["headline"]["what"] == "max |ρ − 1| at step 0 with dropout 0.1" and kwargs["headline"]["bug"] == 0.3
    assert set(kwargs["metrics"]["ppo_effects"]) == {"reward_step0", "reward_end", "reward_learnt", "heldout_accuracy"}


def test_first_minibatch_note_only_with_the_ppo_dropout_measured():
    runs = fake_runs(dropout.PPO_VARIANTS, KEYS)
    assert "per seed" in dropout.first_minibatch_note(runs, RESULTS)
    assert dropout.first_minibatch_note(runs, {k: v for k, v in RESULTS.items() if k[0] == 0.0}) == ""


def test_figures_draw():
    assert drew(dropout.figure_step0(RESULTS))
    fig, ax = axes(4)
    dropout.plot_ppo(ax, fake_runs(dropout.PPO_VARIANTS, KEYS))
    assert drew(fig)


def test_dropout_explorer_toggles_the_fix():
    from workbench.experiments.checkpoints import load

    gpt2, tokenizer = load("tiny-arith-gpt2")
    explorer = dropout.dropout_explorer(gpt2, tokenizer, ["1+2=", "12+34=", "5*5=", "99-3="])
    assert explorer.last["max_ratio_deviation"] > 1e-2
    explorer.controls["disable"].value = True
    assert explorer.last["max_ratio_deviation"] < 1e-4
