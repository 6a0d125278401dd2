"""nb32_same_seed_every_rank: copies across 2 real processes with one seed, none with seed + rank; the verdict,
figures, explorer and metrics."""

import pytest
from pitfall_fakes import check_metrics, drew

from workbench.modeling.tiny import tiny_model
from workbench.pitfalls import nb32_same_seed_every_rank as ss
from workbench.tasks import rl_problems


@pytest.fixture(scope="module")
def setting():
    model, tokenizer = tiny_model("qwen2")
    return model, tokenizer, rl_problems(4)


@pytest.fixture(scope="module")
def measured(setting):
    model, tokenizer, problems = setting
    bug = ss.measure_processes(model, tokenizer, problems, group_size=4, device_specific=False)
    fix = ss.measure_processes(model, tokenizer, problems, group_size=4, device_specific=True)
    return bug, fix


@pytest.fixture(scope="module")
def swept(setting):
    model, tokenizer, problems = setting
    return ss.world_size_sweep(model, tokenizer, problems[:2], [1, 2, 4], group_size=4)


def test_one_seed_on_two_processes_copies_every_completion(measured):
    bug, _ = measured
    assert bug["processes"] == 2 and bug["shares_agree"]  # two real processes, both gathered the same groups
    assert bug["cross_rank_identical"] == 1.0 and bug["distinct_per_group"] <= 2  # at most group_size / world_size distinct


def test_seed_plus_rank_removes_the_copies(measured):
    bug, fix = measured
    assert fix["cross_rank_identical"] < 1.0 and fix["distinct_per_group"] > bug["distinct_per_group"]
    assert ss.verdict(bug, fix) == (True, True)
    assert [ss.rank_seed(5, r) for r in range(3)] == [5, 6, 7] and ss.rank_seed(5, 2, device_specific=False) == 5


def test_verdict_is_false_on_bug_free_numbers(measured):
    _, fix = measured
    assert ss.verdict(fix, fix) == (False, False)  # distinct groups: nothing reproduced, and no gain to call a fix


def test_metrics_figures_and_lines(measured, swept):
    bug, fix = measured
    rows = swept
    one_rank = [r["distinct_per_group"] for r in rows if r["world_size"] == 1]
    assert one_rank[0] == one_rank[1]  # one rank: the two seedings are the same seed
    kwargs = ss.metrics(bug, fix, rows)
    check_metrics(kwargs, "32_same_seed_every_rank")
    assert kwargs["headline"]["bug"] == bug["distinct_per_group"] and set(kwargs["metrics"]) == {"processes", "world_size_sweep"}
    assert drew(ss.figure_same_seed(bug, fix, rows))
    assert len(ss.process_lines(bug, fix).splitlines()) == 2 and len(ss.sweep_lines(rows).splitlines()) == len(rows)
    assert "copies are the bug" in ss.headline_sentence(bug, fix)


def test_world_size_explorer_redraws(swept):
    explorer = ss.world_size_explorer(swept)
    assert explorer.renders == 1 and explorer.last["world_size"] == 2
    explorer.controls["world_size"].value = 4
    assert explorer.renders == 2 and explorer.last["rows"][0]["distinct_per_group"] == 1.0  # 4 ranks, one seed: one completion
