"""nb06_temperature: metrics(), figures and the temperature explorer."""

from pitfall_fakes import axes, check_explorer_fix, check_metrics, drew, fake_runs

from workbench.experiments.checkpoints import load
from workbench.pitfalls import nb06_temperature as temperature
from workbench.pitfalls import nb07_dropout as dropout
from workbench.tasks import rl_problems
from workbench.trainers.ppo import PPOConfig, PPOTrainer

TEMPERATURES = [0.5, 1.0, 2.0]
RESULTS = {(t, fix): {"max_ratio_deviation": 0.0 if fix or t == 1.0 else abs(1 - t)} for t in TEMPERATURES for fix in (False, True)}
KEYS = ("first_ratio_deviation", "clip_fraction", "reward")


def test_metrics_returns_write_metrics_arguments():
    runs = fake_runs(temperature.PPO_VARIANTS, KEYS)
    kwargs = temperature.metrics(results=RESULTS, temperatures=TEMPERATURES, runs=runs, effects=temperature.ppo_effects(runs),
                                 settings={})
    check_metrics(kwargs, "06_temperature")
    assert kwargs["headline"]["what"].endswith("τ = 2.0") and kwargs["headline"]["bug"] == 1.0
    assert set(kwargs["metrics"]["max_ratio_deviation_bug"]) == {"0.5", "1.0", "2.0"}


def test_figures_draw():
    assert drew(temperature.figure_ratio_vs_temperature(RESULTS))
    fig, ax = axes(4)
    temperature.plot_ppo(ax, fake_runs(temperature.PPO_VARIANTS, KEYS), window=1)
    assert drew(fig)
    assert "τ= 0.5" in temperature.ratio_lines(RESULTS, TEMPERATURES)


def test_temperature_explorer_toggles_the_fix():
    check_explorer_fix(temperature.temperature_explorer, "tiny-arith-qwen2", "rescale")


PROMPTS = [p.prompt for p in rl_problems(32)]


def test_p6_temperature_bug_and_fix(qwen):
    model, tokenizer = qwen
    bug = temperature.first_step_ratio(model, tokenizer, PROMPTS, temperature=0.7, rescale=False)
    fix = temperature.first_step_ratio(model, tokenizer, PROMPTS, temperature=0.7, rescale=True)
    assert bug["max_ratio_deviation"] > 0.1 and fix["max_ratio_deviation"] < 1e-4


def test_p6_ppo_switch():
    runs = {}
    for rescale in (False, True):
        model, tokenizer = load("tiny-arith-qwen2")
        config = PPOConfig(steps=1, temperature=0.7, rescale_by_temperature=rescale, progress=False, prompts_per_step=8, mini_batches=1)
        runs[rescale] = PPOTrainer(model, tokenizer, rl_problems(16), config).train()[0]
    assert runs[False]["first_ratio_deviation"] > 0.1 and runs[True]["first_ratio_deviation"] < 1e-4


def test_temperature_and_dropout_verdicts():
    ok = {"max_ratio_deviation": 1e-7, "sequence_kl_k1": 0.0}
    assert temperature.verdict({(0.7, False): ok, (0.7, True): ok, (1.0, False): ok, (1.0, True): ok}) == (False, True)
    assert temperature.verdict({(1.0, False): {"max_ratio_deviation": 0.5}, (1.0, True): ok}) == (False, True)  # τ = 1 is no bug
    assert dropout.verdict({(0.1, False): ok, (0.1, True): ok}) == (False, True)
    assert dropout.verdict({(0.1, False): {"max_ratio_deviation": 0.4}, (0.1, True): {"max_ratio_deviation": 0.4,
                                                                                     "sequence_kl_k1": 0.0}}) == (True, False)


def test_figures_are_readable_at_notebook_width():
    from workbench.viz import legibility

    runs = fake_runs(temperature.PPO_VARIANTS, KEYS, seeds=3, steps=40)
    for fig in (temperature.figure_ratio_vs_temperature(RESULTS), temperature.figure_ppo(runs, 40)):
        assert fig.get_size_inches()[0] <= 9.6
        assert legibility.check_figure(fig).problems() == []
    assert "at most 0.0e+00 (float rounding)" in temperature.ratio_note(RESULTS)
    assert "mean over 3 seeds" in temperature.ppo_note(runs, 40)
