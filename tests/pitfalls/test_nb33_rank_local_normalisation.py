"""nb33_rank_local_normalisation: per-rank token means and shard-local clipping in 2 real processes, the global
fix matching one process; the verdict, figures, explorer and metrics."""

import pytest
from pitfall_fakes import check_metrics, drew

from workbench.pitfalls import nb33_rank_local_normalisation as rn


@pytest.fixture(scope="module")
def rows():
    return rn.measure([1.0, 2.0])


def test_per_rank_mean_weighs_tokens_by_their_rank_count(rows):
    row = rn.headline_row(rows)
    assert row["imbalance"] == 2.0 and row["tokens_per_rank"] == [32, 64]
    # W = 2 ranks: 1 / (2 · 32) and 1 / (2 · 64) in units of 1 / 96
    assert row["weight_short_rank"]["local"] == pytest.approx(96 / 64) and row["weight_long_rank"]["local"] == pytest.approx(96 / 128)
    assert row["weight_ratio"]["local"] == pytest.approx(2.0) and row["grad_error"]["local"] > 0.01
    assert max(abs(c - row["clip_coef_single"]) for c in row["clip_coef_local"]) > 0.01  # shards clipped by their own norms


def test_global_count_and_norm_match_one_process(rows):
    for row in rows:
        assert row["weight_ratio"]["global"] == pytest.approx(1.0, abs=1e-9) and row["grad_error"]["global"] < 1e-9
        assert row["clip_coef_global"] == pytest.approx([row["clip_coef_single"]] * 2, abs=1e-9)
        assert row["clipped_error"]["global"] < 1e-9
    assert rn.verdict(rn.headline_row(rows)) == (True, True)


def test_verdict_is_false_on_bug_free_numbers(rows):
    balanced = dict(rows[0], clip_coef_local=rows[0]["clip_coef_global"])  # equal counts, global clipping
    assert rows[0]["weight_ratio"]["local"] == pytest.approx(1.0)
    assert rn.verdict(balanced) == (False, True)
    broken = dict(rows[1], weight_ratio={"local": 2.0, "global": 2.0})
    assert rn.verdict(broken)[1] is False


def test_metrics_figures_lines(rows):
    head = rn.headline_row(rows)
    kwargs = rn.metrics(rows, head)
    check_metrics(kwargs, "33_rank_local_normalisation")
    assert set(kwargs["metrics"]["by_imbalance"]) == {"1.0", "2.0"} and kwargs["headline"]["bug"] == pytest.approx(2.0)
    assert drew(rn.figure_rank_normalisation(rows, head))
    assert len(rn.row_lines(rows).splitlines()) == 2 and "local coefficients" in rn.clip_lines(rows[1])
    assert "are the bug" in rn.headline_sentence(head)


def test_imbalance_explorer_redraws():
    explorer = rn.imbalance_explorer(2.0)
    assert explorer.renders == 1 and explorer.last["weight_ratio"]["local"] == pytest.approx(2.0)
    explorer.controls["imbalance"].value = 4.0
    assert explorer.renders == 2 and explorer.last["weight_ratio"]["local"] == pytest.approx(4.0)
