"""nb06_temperature: metrics(), figures and the temperature explorer."""

from pitfall_fakes import axes, check_metrics, drew, fake_runs

from workbench.pitfalls import nb06_temperature as temperature

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
    from workbench.experiments.checkpoints import load

    model, tokenizer = load("tiny-arith-qwen2")
    explorer = temperature.temperature_explorer(model, tokenizer, ["1+2=", "12+34=", "5*5=", "99-3="])
    assert explorer.last["max_ratio_deviation"] > 1e-2
    explorer.controls["rescale"].value = True
    assert explorer.last["max_ratio_deviation"] < 1e-4
