"""Notebook 24's pitfall module: reward-model pooling at 'first pad − 1' vs the rightmost attended token."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.pitfalls import nb24_reward_model_pooling as pooling  # noqa: E402
from workbench.viz import legibility  # noqa: E402

IDS = torch.tensor([[7, 8, 2, 2, 2], [2, 2, 7, 8, 2], [7, 2, 8, 9, 2]])  # right-padded, left-padded, an EOS inside; EOS = 2
MASK = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])


def test_pool_index_rules():
    assert pooling.pool_index(IDS, MASK, 2, "first pad − 1").tolist() == [1, 4, 0]  # before the EOS, the wrap, the prompt
    assert pooling.pool_index(IDS, MASK, 2, "rightmost non-pad").tolist() == [1, 3, 3]  # PR #35911: skips the trailing EOS
    assert pooling.pool_index(IDS, MASK, 2, "rightmost attended").tolist() == [2, 4, 4]
    assert pooling.pool_index(IDS, MASK, 0, "first pad − 1").tolist() == [4, 4, 4]  # pad 0 absent: −1 wraps to the last column


@pytest.fixture(scope="module")
def measured(qwen):
    model, tokenizer = qwen
    return pooling.sweep(model, tokenizer, 6), pooling.sweep(model, tokenizer, 6, eos_inside=True)


def test_bug_scores_a_text_by_its_batch_with_pad_equal_eos(measured):
    rows, inside = measured
    bug = pooling.scenario_row(rows, "left", True, "first pad − 1")
    assert bug["max_abs_score_delta"] > 1e-3 and bug["changed_share"] > 0
    assert pooling.scenario_row(inside, "right", True, "first pad − 1")["mean_abs_offset"] > 1  # pooled inside the prompt


def test_fix_pools_the_last_real_token_everywhere(measured):
    rows, inside = measured
    for r in rows + inside:
        if r["rule"] == "rightmost attended":
            assert r["wrong_token_share"] == 0 and r["max_abs_score_delta"] < 1e-4
    assert pooling.scenario_row(rows, "right", False, "first pad − 1")["max_abs_score_delta"] < 1e-4  # the bug is silent here


def test_verdict_both_ways(measured):
    rows, inside = measured
    assert pooling.verdict(rows, inside) == (True, True)
    bug_free = [dict(r, max_abs_score_delta=0.0, wrong_token_share=0.0) for r in rows]
    assert pooling.verdict(bug_free, [dict(r, wrong_token_share=0.0) for r in inside])[0] is False
    broken = [dict(r, wrong_token_share=0.5) for r in inside]
    assert pooling.verdict(rows, broken)[1] is False


def test_figure_metrics_and_explorer(measured, qwen, tmp_path):
    rows, inside = measured
    fig = pooling.figure_pooling(rows, inside)
    assert len(fig.axes) == 3 and all(ax.has_data() for ax in fig.axes)
    assert legibility.check_figure(fig).problems() == []
    ticks = [t.get_text() for t in fig.axes[-1].get_xticklabels()]
    assert len(ticks) == len(set(ticks)) == 6  # every scenario named once: four without an EOS inside, two with pad = EOS
    assert "pad ≠ EOS that EOS is an ordinary token" in pooling.pooling_note(rows, inside)
    plt.close(fig)
    head = pooling.headline_rows(rows, inside)
    written = written_metrics(pooling.metrics(rows, inside, head), tmp_path)
    assert written["reproduced"] is True and set(written["metrics"]) == {"scenarios", "eos_inside"}
    assert written["headline"]["bug"] > written["headline"]["fix"]
    assert pooling.headline_sentence(rows, inside, head).startswith("Left padding with pad = EOS")
    assert len(pooling.pooling_lines(rows, inside).splitlines()) == len(rows) + len(inside)
    explorer = pooling.pooling_explorer(*qwen, n_texts=4)
    assert explorer.renders == 1 and explorer.last["rightmost attended"]["max_abs_score_delta"] < 1e-4
    explorer.controls["side"].value = "right"
    assert explorer.renders == 2 and explorer.last["first pad − 1"]["max_abs_score_delta"] < 1e-4
