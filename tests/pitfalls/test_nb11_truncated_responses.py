"""nb11_truncated_responses: metrics(), figures and the EOS-rate explorer."""

import math

import pytest
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


def test_budget_profile_counts_what_the_budget_cuts_and_what_the_bug_can_pay(tokenizer):
    """Hand-counted: at budget 8, "55 55 55" (8 characters + EOS) is cut after a right "55" it could have stopped at;
    "123 123" + EOS fits; "-99 -99 -99" is cut just before its third copy ("-99 -99 "), right when read by its first
    answer; a wrong-looking "x5 5 5 5 5" (first field not an integer) is cut and not paid. On arith at budget 3, "123"
    is cut right after its only answer: paid, but it never went on, and no right response fits with its EOS."""
    from workbench.tasks import arithmetic, restate

    problems = [restate.make_problem("47+8=", "55", 2), restate.make_problem("99+24=", "123", 1),
                restate.make_problem("0-99=", "-99", 2), restate.make_problem("1+1=", "2", 0),
                arithmetic.Problem("2+3=", "x5 5 5 5 5", task="restate")]
    profile = truncation.budget_profile(tokenizer, problems, 8)
    assert profile == {"problems": 5, "cut": 0.6, "paid": 2 / 3, "went_on": 1.0, "unfinishable": 0.2}
    arith = [arithmetic.Problem("99+24=", "123"), arithmetic.Problem("47+8=", "55")]
    assert truncation.budget_profile(tokenizer, arith, 3) == {"problems": 2, "cut": 0.5, "paid": 1.0, "went_on": 0.0,
                                                               "unfinishable": 0.5}
    nothing = truncation.budget_profile(tokenizer, arith, 8)
    assert nothing["cut"] == 0.0 and nothing["unfinishable"] == 0.0 and math.isnan(nothing["paid"]) and math.isnan(nothing["went_on"])
    assert "% of those" not in truncation.budget_sentence(nothing, "arith", 8)  # nothing cut: no shares of nothing
    sentence = truncation.budget_sentence(profile, "restate", 8)
    assert "60.0% of 5 supervised responses" in sentence and "66.7% of those" in sentence and "20.0% of the problems" in sentence
    with pytest.raises(ValueError, match="at least one problem"):
        truncation.budget_profile(tokenizer, [], 8)


def test_on_the_restate_checkpoint_the_bug_pays_responses_that_went_on_past_their_answer():
    """The default regime of notebook 11: tiny-restate-qwen2 at budget 8. Truncated responses are rewarded only under the
    bug, and the bug moves the in-loss advantage towards them by more than 2 s.e. over the mixed groups."""
    model, tokenizer = load("tiny-restate-qwen2")
    measured = truncation.pressure(model, tokenizer, rl_problems(32, "restate"), VARIANTS, max_new_tokens=8)
    assert measured[truncation.BUG]["truncated_rewarded"] > 0 == measured[truncation.REFERENCE]["truncated_rewarded"]
    bug = measured[truncation.BUG]
    assert 0 < bug["truncated_rewarded_mixed"] <= bug["truncated_rewarded"] and truncation.not_shown(measured) is None
    value, se, groups = truncation.shift_noise(measured)
    assert groups >= 10 and value > 0.2 and value > 2 * se
    assert truncation.verdict(measured) == (True, True)


def test_not_shown_when_no_rewarded_truncated_response_sits_in_a_mixed_group():
    """A truncated response rewarded under the bug in a group of truncated responses only moves no pressure (its
    advantage is relative to its truncated siblings): the checkpoint cannot show the pitfall, and says so (seen with
    realistic-llama: 1 rewarded of 3018 truncated, 49 mixed groups, every gap 0)."""
    base = {"pressure": 0.0, "truncated": 3018, "mixed_groups": 49, "group_gaps": [0.0] * 49}
    fixes = {label: {**base, "truncated_rewarded": 0, "truncated_rewarded_mixed": 0} for label in VARIANTS if label != truncation.BUG}
    outside = {truncation.BUG: {**base, "truncated_rewarded": 1, "truncated_rewarded_mixed": 0}, **fixes}
    assert truncation.verdict(outside) == (False, True)
    assert "1 of the 3018 truncated responses earn a reward" in truncation.not_shown(outside)
    assert "none in the 49 groups" in truncation.not_shown(outside)
    inside = {**outside, truncation.BUG: {**outside[truncation.BUG], "truncated_rewarded_mixed": 1}}
    assert truncation.not_shown(inside) is None
    nothing = {**outside, truncation.BUG: {**base, "truncated_rewarded": 0, "truncated_rewarded_mixed": 0}}
    assert "untrained checkpoint" in truncation.not_shown(nothing)
