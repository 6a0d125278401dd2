"""nb07_dropout: metrics(), figures and the dropout explorer."""

import torch
from pitfall_fakes import axes, check_explorer_fix, check_metrics, drew, fake_runs

from workbench.experiments.checkpoints import load
from workbench.modeling.dropout import disable_dropout
from workbench.pitfalls import nb07_dropout as dropout
from workbench.tasks import rl_problems
from workbench.trainers.ppo import PPOConfig, PPOTrainer

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
    check_explorer_fix(dropout.dropout_explorer, "tiny-arith-gpt2", "disable")


PROMPTS = [p.prompt for p in rl_problems(32)]


def test_p7_dropout_bug_and_fix():
    model, tokenizer = load("tiny-arith-gpt2")
    bug = dropout.step0_mismatch(model, tokenizer, PROMPTS, dropout=0.1, disable=False)
    fix = dropout.step0_mismatch(model, tokenizer, PROMPTS, dropout=0.1, disable=True)
    assert bug["max_ratio_deviation"] > 0.1 and abs(bug["sequence_kl_k1"]) > 0.01
    assert fix["max_ratio_deviation"] < 1e-4 and abs(fix["sequence_kl_k1"]) < 1e-4


def test_p7_disable_dropout_switches_every_site_off():
    model, _ = load("tiny-arith-gpt2")
    dropout.set_dropout(model, 0.2)
    assert disable_dropout(model) > 0
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))


def test_p7_ppo_switch():
    runs = {}
    for disable in (False, True):
        model, tokenizer = load("tiny-arith-gpt2")
        dropout.set_dropout(model, 0.1)
        config = PPOConfig(steps=1, disable_dropout=disable, progress=False, prompts_per_step=8, mini_batches=1)
        runs[disable] = PPOTrainer(model, tokenizer, rl_problems(16), config).train()[0]
    assert runs[False]["train_ratio_deviation"] > 0.1 and runs[True]["train_ratio_deviation"] < 1e-4


def test_dropout_step0_note_reads_median_and_max():
    from workbench.pitfalls import nb07_dropout as dropout

    def r(mx, med):
        return {"max_ratio_deviation": mx, "median_abs_log_ratio": med, "tokens": 200}

    jumpy = {(0.0, False): r(1e-6, 1e-7), (0.05, False): r(203.0, 0.08), (0.1, False): r(7.9, 0.9), (0.1, True): r(1e-6, 1e-7)}
    note = dropout.step0_note(jumpy)
    assert "(rises with" in note and "heavy-tail extreme" in note
    steady = {(0.0, False): r(1e-6, 1e-7), (0.1, False): r(7.9, 0.9)}
    assert "heavy-tail" not in dropout.step0_note(steady)
    assert "does not rise" in dropout.step0_note({(0.0, False): r(1.0, 0.5), (0.1, False): r(2.0, 0.1)})


def test_figures_are_readable_at_notebook_width():
    from workbench.viz import legibility

    runs = fake_runs(dropout.PPO_VARIANTS, KEYS, seeds=3, steps=40)
    for fig in (dropout.figure_step0(RESULTS), dropout.figure_ppo(runs)):
        assert fig.get_size_inches()[0] <= 9.6
        assert legibility.check_figure(fig).problems() == []
    assert "at most 0.0e+00 (float rounding)" in dropout.step0_figure_note(RESULTS)
    assert "mean over 3 seeds" in dropout.ppo_note(runs)
