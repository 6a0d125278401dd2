"""Notebook 26's pitfall module: GSPO's broadcast-then-token-mean weighs samples by length; the per-sequence mean does not."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.pitfalls import nb26_gspo_length_weighting as gspo  # noqa: E402
from workbench.viz import legibility  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    return gspo.length_ratio_sweep([8, 40], 4)


def test_bug_weighs_a_sample_by_its_length(rows):
    assert rows[1]["broadcast token-mean"] == pytest.approx(10.0, rel=1e-3)  # 40 / 4 tokens
    assert rows[0]["broadcast token-mean"] == pytest.approx(2.0, rel=1e-3)


def test_fix_weighs_every_sample_equally(rows):
    assert all(r["per-sequence mean"] == pytest.approx(1.0, rel=1e-3) for r in rows)
    weights = gspo.sample_weights([2, 7, 30], "per-sequence mean")
    assert torch.allclose(weights, torch.full((3,), 1 / 3), rtol=1e-3)


def test_sequence_ratio_ignores_padding():
    logp = torch.tensor([[-1.0, -2.0, -9.0]])
    old = torch.tensor([[-1.5, -2.5, 0.0]])  # the padded position differs wildly
    assert float(gspo.sequence_ratio(logp, old, torch.tensor([[1, 1, 0]]))) == pytest.approx(float(torch.exp(torch.tensor(0.5))))


def test_verdict_both_ways(rows):
    assert gspo.verdict(rows) == (True, True)
    bug_free = [dict(r, **{"broadcast token-mean": 1.0}) for r in rows]
    assert gspo.verdict(bug_free)[0] is False
    unfixed = [dict(r, **{"per-sequence mean": r["length_ratio"]}) for r in rows]
    assert gspo.verdict(unfixed)[1] is False


def test_batch_share_of_the_longest_quarter_follows_tokens_only_with_the_bug():
    batch = gspo.batch_weights([2, 2, 2, 10])
    assert batch["broadcast token-mean longest-quarter share"] == pytest.approx(10 / 16, rel=1e-3)
    assert batch["per-sequence mean longest-quarter share"] == pytest.approx(0.25, rel=1e-3)


def test_figure_metrics_and_explorer(rows, tmp_path):
    batch = gspo.batch_weights([3, 5, 9, 12])
    fig = gspo.figure_gspo(rows, batch)
    assert len(fig.axes) == 2 and all(ax.has_data() for ax in fig.axes)
    assert legibility.check_figure(fig).problems() == []
    assert "4 responses" in gspo.gspo_note(rows, batch)
    plt.close(fig)
    head = gspo.headline_row(rows)
    written = written_metrics(gspo.metrics(rows, batch, head), tmp_path)
    assert written["reproduced"] is True and written["fixed"] is True
    assert set(written["metrics"]) == {"length_ratio_sweep", "sampled_batch"}
    assert written["headline"]["bug"] == pytest.approx(10.0, rel=1e-3)
    assert len(gspo.ratio_lines(rows, batch).splitlines()) == len(rows) + 1
    assert gspo.headline_sentence(rows, head).startswith(f"{head['long']} vs {head['short']} tokens")
    explorer = gspo.length_explorer(4, 32)
    assert explorer.renders == 1 and explorer.last["broadcast token-mean"] == pytest.approx(8.0, rel=1e-3)
    explorer.controls["long"].value = 12
    assert explorer.renders == 2 and explorer.last["broadcast token-mean"] == pytest.approx(3.0, rel=1e-3)
