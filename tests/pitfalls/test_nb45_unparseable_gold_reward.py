"""nb45_unparseable_gold_reward: reward 1 for an unparseable gold answer (the bug) vs skipping it (the fix) — the
logged reward, the advantages under three normalisations against hand-computed values, the verdict, figures,
explorer and metrics."""

import math

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.pitfalls import nb45_unparseable_gold_reward as ug

# two prompts × 4 completions: prompt 0 parseable (1, 0, 0, 1), prompt 1 unparseable
BATCH = {"correct": torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]]),
         "unparseable": torch.tensor([[False] * 4, [True] * 4]), "group_size": 4}


def test_rewards_and_logged_reward_by_hand():
    assert ug.rewards(BATCH, "one")[1].tolist() == [1.0] * 4
    assert ug.logged_reward(ug.rewards(BATCH, "one")) == pytest.approx(6 / 8)  # true accuracy 2/4
    assert ug.logged_reward(ug.rewards(BATCH, "zero")) == pytest.approx(2 / 8)
    assert ug.logged_reward(ug.rewards(BATCH, "skip")) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="policy must be one of"):
        ug.rewards(BATCH, "none")


def test_advantages_by_hand():
    std4 = math.sqrt(4 / 3 * 0.25)  # Bessel std of (1, 0, 0, 1)
    group = ug.advantages(ug.rewards(BATCH, "one"), "group")
    assert group[0].tolist() == pytest.approx([a / (std4 + ug.EPS) for a in (0.5, -0.5, -0.5, 0.5)])
    assert group[1].tolist() == [0.0] * 4  # all-equal group: hidden
    # batch: rewards (1,0,0,1,1,1,1,1): mean 0.75, Bessel std sqrt(8/7 · 0.1875)
    std8 = math.sqrt(8 / 7 * 0.1875)
    batch = ug.advantages(ug.rewards(BATCH, "one"), "batch")
    assert batch[1, 0].item() == pytest.approx(0.25 / (std8 + ug.EPS)) and batch[0, 1].item() == pytest.approx(-0.75 / (std8 + ug.EPS))
    mixed = ug.advantages(ug.rewards(BATCH, "one"), "group-batch-std")
    assert mixed[0, 0].item() == pytest.approx(0.5 / (std8 + ug.EPS)) and mixed[1].tolist() == [0.0] * 4
    skipped = ug.advantages(ug.rewards(BATCH, "skip"), "batch")
    assert skipped[1].tolist() == [0.0] * 4 and skipped[0, 0].item() == pytest.approx(0.5 / (std4 + ug.EPS))
    with pytest.raises(ValueError, match="scope must be one of"):
        ug.advantages(ug.rewards(BATCH, "one"), "rank")


def test_batch_case_bug_and_fix():
    row = ug.batch_case(BATCH)
    assert row["one"]["inflation"] == pytest.approx(0.25) and row["zero"]["inflation"] == pytest.approx(-0.25)
    assert row["one"]["error_group"] == 0.0 and row["one"]["error_batch"] > 0.1 and row["one"]["unparseable_batch"] > 0
    assert all(row["skip"][f"error_{s}"] < 1e-6 for s in ug.SCOPES) and row["skip"]["inflation"] == 0.0
    assert ug.verdict(row) == (True, True)


def test_verdict_both_ways_on_drawn_batches():
    rows = ug.share_sweep([0.0, 0.25], n_prompts=32, group_size=8, accuracy=0.3)
    assert ug.verdict(rows[0]) == (False, True)  # nothing unparseable: nothing to reproduce
    assert ug.verdict(rows[1]) == (True, True)
    assert rows[1]["one"]["inflation"] > 0.1 and rows[1]["one"]["error_batch"] > 0.1 and rows[1]["one"]["error_group"] == 0.0
    broken = {**rows[1], "skip": {**rows[1]["skip"], "error_batch": 0.3}}
    assert ug.verdict(broken) == (True, False)
    with pytest.raises(ValueError, match="accuracy"):
        ug.reward_batch(4, 4, 0.1, 1.0)
    with pytest.raises(ValueError, match="group_size"):
        ug.reward_batch(4, 1, 0.1, 0.5)


def test_metrics_figures_lines_and_explorer():
    from workbench.viz import legibility

    rows = ug.share_sweep([0.0, 0.1, 0.25], n_prompts=32, group_size=8, accuracy=0.3)
    head = ug.headline_row(rows, 0.25)
    kwargs = ug.metrics(rows, head, {})
    check_metrics(kwargs, "45_unparseable_gold_reward")
    assert kwargs["reproduced"] and kwargs["fixed"] and kwargs["headline"]["bug"] > 0.1 and kwargs["headline"]["fix"] == 0.0
    fig = ug.figure_unparseable(rows, head)
    assert drew(fig) and fig.get_size_inches()[0] <= 9.6 and legibility.check_figure(fig).problems() == []
    assert len(ug.share_lines(rows).splitlines()) == 3
    assert ug.headline_sentence(head).startswith("25% of prompts unparseable") and "reproduced" in ug.headline_sentence(head)
    assert "scale_rewards" in ug.unparseable_note(rows, head, 32, 8)
    explorer = ug.unparseable_explorer(n_prompts=16)
    assert explorer.renders == 1 and explorer.last["one"]["error_batch"] > 0
    explorer.controls["share"].value = 0.0
    assert explorer.renders == 2 and explorer.last["one"]["inflation"] == 0.0
