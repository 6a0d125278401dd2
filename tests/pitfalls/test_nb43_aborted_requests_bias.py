"""nb43_aborted_requests_bias: the engine simulated by hand, the survival theory, the verdict on numbers, metrics(), the
figure, the printed lines and the explorer; the tiny sums policy end to end (slow)."""

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.pitfalls import nb43_aborted_requests_bias as p43

LENGTHS = torch.tensor([[3.0, 3.0], [8.0, 8.0]])


def test_engine_by_hand():
    # 4 slots: all four requests start at step 1; group 0 finishes at step 3, the update at step 5 aborts group 1
    bug = p43.simulate_engine(LENGTHS, slots=4, update_interval=5, abort_on_update=True, phase=0)
    assert bug["kept"].tolist() == [[True, True], [False, False]] and bug["aborted"] == 2 and bug["steps"] == 5
    fix = p43.simulate_engine(LENGTHS, slots=4, update_interval=5, abort_on_update=False, phase=0)
    assert fix["kept"].all() and fix["aborted"] == 0 and fix["steps"] == 8
    # 2 slots, group 1 first or second: an update every 100 steps at step 50 never catches a request in flight
    assert p43.simulate_engine(LENGTHS, slots=2, update_interval=100, abort_on_update=True, phase=50)["kept"].all()
    assert p43.survival_theory(torch.tensor([0.0, 16.0, 40.0]), 32).tolist() == [1.0, 0.5, 0.0]


def test_effects_on_a_made_pool_and_the_verdict_both_ways():
    pool = {"lengths": torch.tensor([[4.0, 4.0], [30.0, 30.0]] * 8), "rewards": torch.tensor([[1.0, 1.0], [0.0, 0.0]] * 8),
            "group_size": 2, "length_reward_corr": -1.0}
    effects = p43.abort_effects(pool, slots=4, update_interval=32, seeds=[0, 1, 2, 3])
    assert effects["true_length"] == 17.0 and effects["true_reward"] == 0.5
    assert effects["bug"]["length_bias_mean"] < -3 and effects["bug"]["reward_bias_mean"] > 0.1  # short = rewarded here
    assert effects["fix"]["length_bias_mean"] == 0.0 and effects["fix"]["groups_dropped"] == 0.0
    assert effects["bug"]["kept_by_length"][30] < effects["bug"]["kept_by_length"][4]
    assert p43.verdict(effects) == (True, True) and p43.not_shown(effects) is None
    quiet = {**effects, "bug": {**effects["bug"], "length_bias_mean": -0.1, "length_bias_se": 0.05}}  # 0.6% of 17 steps
    assert p43.verdict(quiet) == (False, True) and "shorter by 0.10 steps" in p43.not_shown(quiet)
    broken = {**effects, "fix": {**effects["fix"], "groups_dropped": 0.1}}
    assert p43.verdict(broken) == (True, False)


def test_metrics_figure_lines_and_explorer():
    pool = {"lengths": torch.tensor([[4.0, 6.0], [30.0, 24.0]] * 4), "rewards": torch.tensor([[1.0, 0.0], [0.0, 1.0]] * 4),
            "group_size": 2, "length_reward_corr": -0.2}
    effects = p43.abort_effects(pool, slots=4, update_interval=32, seeds=[0, 1])
    sweep = p43.interval_sweep(pool, slots=4, update_intervals=[16, 64], seeds=[0, 1])
    kwargs = p43.metrics(effects, sweep, pool)
    check_metrics(kwargs, "43_aborted_requests_bias")
    assert kwargs["headline"]["fix"] == 0.0 and kwargs["headline"]["bug"] == effects["bug"]["length_bias_mean"]
    assert "kept_by_length" not in kwargs["metrics"]["bug"] and set(kwargs["metrics"]["sweep"]) == {"16", "64"}
    assert drew(p43.figure_abort_bias(effects, sweep))
    assert p43.pool_line(pool).startswith("16 responses (8 groups of 2): length 16.0 (range 4–30) decode steps")
    lines = p43.effects_lines(effects).splitlines()
    assert lines[0] == "update every 32 steps, 4 slots, seeds [0, 1]:" and "0 aborts, 0% of groups dropped" in lines[2]
    sentence = p43.reward_sentence(effects, pool)
    assert sentence.startswith("corr(length, reward) of the policy's responses -0.20; the trained reward's bias")
    loud = {**effects, "bug": {**effects["bug"], "reward_bias_mean": 0.05, "reward_bias_se": 0.01}}
    assert p43.reward_sentence(loud, pool).endswith("+0.050 ± 0.010 is beyond 2 s.e.: the logged reward is biased up")
    quiet = {**effects, "bug": {**effects["bug"], "reward_bias_mean": -0.008, "reward_bias_se": 0.015}}
    assert p43.reward_sentence(quiet, pool).endswith("within 2 s.e. of 0: no reward bias shown at this interval")
    assert p43.sweep_lines(sweep).splitlines()[0].startswith("U =   16: trained length")
    explorer = p43.interval_explorer(pool, slots=4, seeds=[0, 1])
    assert explorer.renders == 1 and explorer.last["update_interval"] == 64 and explorer.last["length_bias_fix"] == 0.0
    explorer.controls["update_interval"].value = 16
    assert explorer.renders == 2 and explorer.last["length_bias_bug"] < 0


@pytest.mark.slow
def test_p43_tiny_sums_policy_is_trained_on_short_responses_when_aborted():
    from workbench.experiments.checkpoints import load

    model, tokenizer = load("tiny-sums-qwen2")
    pool = p43.response_pool(model, tokenizer, 16, 4)
    assert pool["lengths"].shape == (16, 4) and pool["lengths"].min() >= 2
    effects = p43.abort_effects(pool, slots=32, update_interval=32, seeds=[0, 1, 2, 3, 4])
    assert p43.verdict(effects) == (True, True)
