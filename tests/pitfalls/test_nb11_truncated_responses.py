"""nb11_truncated_responses: metrics(), figures and the EOS-rate explorer."""

from pitfall_fakes import axes, check_metrics, drew, fake_runs

from workbench.pitfalls import nb11_truncated_responses as truncation

VARIANTS = truncation.variants(0.5)
MEASURED = {label: {"pressure": 0.2 if label == truncation.BUG else -0.1, "truncated": 5, "truncated_rewarded": 2,
                    "mixed_groups": 3, "group_gaps": [0.1, 0.2, 0.3] if label == truncation.BUG else [-0.1, -0.1, -0.2]}
            for label in VARIANTS}
KEYS = ("finished_fraction", "reward", "truncated_rewarded")


def test_metrics_returns_write_metrics_arguments():
    runs = fake_runs(VARIANTS, KEYS)
    kwargs = truncation.metrics(measured=MEASURED, runs=runs, effects=truncation.training_effects(runs), settings={})
    check_metrics(kwargs, "11_truncated_responses")
    assert kwargs["reproduced"] and kwargs["fixed"] and kwargs["not_shown"] is None
    assert kwargs["headline"]["bug"] == 0.2 and set(kwargs["metrics"]["eos_rate_end"]) == set(VARIANTS)
    assert isinstance(kwargs["metrics"]["truncated_rewarded"][truncation.BUG], int)


def test_figures_draw():
    assert drew(truncation.figure_pressure(MEASURED))
    fig, ax = axes(3)
    truncation.plot_training_bands(ax, fake_runs(VARIANTS, KEYS), window=1)
    assert drew(fig)
    assert "pressure +0.200" in truncation.pressure_lines(MEASURED)


def test_eos_rate_explorer_shows_one_run_at_a_time():
    runs = fake_runs(["a", "b"], ("finished_fraction",), steps=2)
    for histories in runs.values():
        for h in histories[0]:
            del h["step"]  # no "step": the explorer numbers them
    explorer = truncation.eos_rate_explorer(runs)
    assert explorer.last == {"first": 0.0, "last": 0.05}
    explorer.controls["run"].value = "b"
    assert explorer.renders == 2 and abs(explorer.last["first"] - 0.1) < 1e-12
