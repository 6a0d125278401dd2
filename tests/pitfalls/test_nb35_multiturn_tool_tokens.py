"""nb35_multiturn_tool_tokens: reward-to-go reset at tool tokens and span lengths (the bugs) vs the model-only
reference (the fixes); the verdict, figures, explorer and metrics."""

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.pitfalls import nb35_multiturn_tool_tokens as tt


def test_verl_example_reset_vs_carried():
    rewards, mask = torch.tensor([0.0, 0.0, 1.0]), torch.tensor([1.0, 0.0, 1.0])
    assert tt.reward_to_go(rewards, mask, 0.5, reset_at_masked=True).tolist() == [0.0, 0.5, 1.0]
    assert tt.reward_to_go(rewards, mask, 0.5).tolist() == [0.5, 1.0, 1.0]


def test_fixed_scan_equals_the_compact_reference_and_padding_stays_zero():
    row = tt.returns_case([3, 2, 4], [5, 1], gamma=0.9, padding=3)
    assert row["error_fix"] < 1e-6 and row["padding_returns_fix"] == 0.0
    assert row["first_turn_bug"] == 0.0 and row["lost_bug"] == pytest.approx(5 / 9)  # two turns of 3 + 2 tokens lose it
    single = tt.returns_case([4], [], gamma=0.9)
    assert single["error_bug"] < 1e-6  # one turn, no tool token: the resetting scan is right too


def test_span_length_counts_tool_tokens_and_the_penalty_follows():
    rows = tt.penalty_sweep([0, 16], [20, 20, 20], max_length=96, buffer=32)
    assert rows[0]["length"] == {"bug": 60, "fix": 60, "reference": 60} and rows[0]["penalty"]["bug"] == 0.0
    assert rows[1]["length"]["bug"] == 60 + 2 * 16 and rows[1]["penalty"]["bug"] == pytest.approx(-28 / 32)
    assert rows[1]["penalty"]["fix"] == 0.0
    assert tt.overlong_penalty(200, 96, 32) == -1.0 and tt.response_length(torch.zeros(4)) == 0
    with pytest.raises(ValueError, match="tool observations"):
        tt.trajectory([2, 2], [])


def test_verdict_both_ways():
    turns = tt.turns_sweep(3, 4, 5, 1.0)
    penalties = tt.penalty_sweep([0, 16], [20, 20, 20], 96, 32)
    assert tt.verdict(turns[-1], penalties[-1]) == (True, True)
    assert tt.verdict(turns[0], penalties[0]) == (False, True)  # one turn, no tool tokens: nothing to reproduce
    broken = dict(turns[-1], error_fix=0.5)
    assert tt.verdict(broken, penalties[-1])[1] is False


def test_metrics_figures_lines_and_explorer():
    turns = tt.turns_sweep(3, 4, 5, 1.0)
    penalties = tt.penalty_sweep([0, 16], [20, 20, 20], 96, 32)
    head = tt.headline_rows(turns, penalties)
    kwargs = tt.metrics(turns, penalties, head)
    check_metrics(kwargs, "35_multiturn_tool_tokens")
    assert kwargs["reproduced"] and kwargs["fixed"] and (kwargs["headline"]["bug"], kwargs["headline"]["fix"]) == (0.0, 1.0)
    assert drew(tt.figure_tool_tokens(turns, penalties, head, 96, 32))
    assert len(tt.returns_lines(turns).splitlines()) == 3 and len(tt.penalty_lines(penalties).splitlines()) == 2
    assert "[0.0, 0.5, 1.0]" in tt.example_line(0.5)
    assert tt.headline_sentence(head).startswith("first-turn reward-to-go in a 3-turn response")
    explorer = tt.tool_length_explorer([20, 20, 20], 96, 32)
    assert explorer.renders == 1 and explorer.last["penalty"]["penalty"]["bug"] < 0
    explorer.controls["tool_length"].value = 0
    assert explorer.renders == 2 and explorer.last["penalty"]["penalty"]["bug"] == 0.0
