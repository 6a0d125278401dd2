"""nb11_truncated_responses: metrics(), figures and the EOS-rate explorer."""

from pitfall_fakes import axes, check_metrics, drew, fake_runs

from workbench.experiments.checkpoints import load
from workbench.pitfalls import nb11_truncated_responses as truncation
from workbench.tasks import rl_problems
from workbench.trainers.grpo import GRPOConfig, GRPOTrainer

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


def measured(bug_gaps, ref_gaps):
    def m(gaps):
        return {"pressure": sum(gaps) / len(gaps), "group_gaps": gaps, "mixed_groups": len(gaps)}
    return {truncation.BUG: m(bug_gaps), truncation.REFERENCE: m(ref_gaps), "masked out of the loss": {"pressure": 0.0}}


def test_p11_truncated_responses_rewarded_only_under_the_bug():
    runs = {}
    for bug in (True, False):
        model, tokenizer = load("tiny-arith-qwen2")
        config = GRPOConfig(steps=3, max_new_tokens=3, score_truncated_as_finished=bug, progress=False)
        runs[bug] = sum(h["truncated_rewarded"] for h in GRPOTrainer(model, tokenizer, rl_problems(64), config).train())
    assert runs[True] > 0 and runs[False] == 0


def test_truncation_verdict_measures_the_push_towards_truncation():
    fixes = {"zero reward without EOS": {"pressure": -0.2}, "masked out of the loss": {"pressure": 0.0}}
    assert truncation.verdict({truncation.BUG: {"pressure": -0.2}, **fixes}) == (False, True)  # the bug changes nothing
    assert truncation.verdict({truncation.BUG: {"pressure": 0.4}, **fixes, "penalised": {"pressure": 0.1}}) == (True, False)
    assert "towards" in truncation.conclusion({truncation.BUG: {"pressure": -0.1, "mixed_groups": 3}, **fixes})


def test_truncation_pressure_on_a_model():
    from workbench.experiments.checkpoints import load
    from workbench.tasks import rl_problems

    model, tokenizer = load("tiny-arith-qwen2")
    measured = truncation.pressure(model, tokenizer, rl_problems(8), truncation.variants(0.5), max_new_tokens=3,
                                   num_generations=4)
    assert measured[truncation.BUG]["truncated_rewarded"] >= measured["zero reward without EOS"]["truncated_rewarded"] == 0
    assert measured[f"penalised ({0.5})"]["pressure"] <= measured["zero reward without EOS"]["pressure"] <= 0


def test_consistent_shift_is_reproduced_with_its_standard_error():
    data = measured([0.30, 0.32, 0.28, 0.31, 0.29], [-0.1, -0.1, -0.1, -0.1, -0.1])
    value, se, n = truncation.shift_noise(data)
    assert n == 5 and abs(value - 0.4) < 1e-9 and 0 < se < 0.01
    assert truncation.verdict(data) == (True, True)  # reference −0.1 and masked 0: no fix favours truncation
    assert "larger than 2 s.e." in truncation.conclusion(data)


def test_shift_within_noise_is_not_reproduced():
    data = measured([1.0, -0.8, 0.9, -0.7, 0.1], [0.0] * 5)  # mean shift 0.1 > 0.05, s.e. ≈ 0.37
    assert truncation.verdict(data)[0] is False
    assert "within the sampling noise" in truncation.conclusion(data)


def test_without_group_gaps_the_threshold_alone_decides():
    data = {truncation.BUG: {"pressure": 0.4, "mixed_groups": 3}, truncation.REFERENCE: {"pressure": 0.0}}
    assert truncation.shift_noise(data)[1] != truncation.shift_noise(data)[1]  # NaN
    assert truncation.verdict(data)[0] is True
