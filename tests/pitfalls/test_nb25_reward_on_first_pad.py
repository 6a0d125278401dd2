"""Notebook 25's pitfall module and PPO's ``reward_position`` switch: the score on the first pad vs on the EOS."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.core.errors import ConfigError  # noqa: E402
from workbench.pitfalls import nb25_reward_on_first_pad as rp  # noqa: E402
from workbench.trainers.ppo import PPOConfig, last_token_rewards  # noqa: E402
from workbench.viz import legibility  # noqa: E402

MASK = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]).float()
SCORES = torch.tensor([1.0, -1.0, 1.0])


@pytest.fixture(scope="module")
def batch():
    return rp.placement(SCORES, MASK)


def test_bug_puts_the_score_one_token_after_the_eos_on_padded_rows():
    assert rp.reward_offsets(MASK, "first_pad").tolist() == [1, 0, 1]  # the full row keeps its last token
    assert rp.reward_offsets(MASK, "eos").tolist() == [0, 0, 0]


def test_bug_discounts_or_drops_the_score(batch):
    assert batch["first_pad"]["eos_share, GAE over every position"] == pytest.approx(0.95, abs=1e-5)  # γλ
    assert batch["first_pad"]["eos_share, GAE over real tokens"] == 0.0
    assert batch["eos"]["eos_share, GAE over every position"] == pytest.approx(1.0, abs=1e-6)
    assert last_token_rewards(SCORES, MASK, "first_pad")[0].abs().sum() == 0  # the trainer's bug drops it


def test_ppo_switch_defaults_to_the_fix_and_is_validated():
    assert PPOConfig().reward_position == "eos"
    PPOConfig(reward_position="first_pad").validate()
    with pytest.raises(ConfigError, match="reward_position"):
        PPOConfig(reward_position="pad").validate()


def test_verdict_both_ways(batch):
    assert rp.verdict(batch) == (True, True)
    bug_free = rp.placement(SCORES, torch.ones(3, 5))  # no row has a pad: nothing to misplace
    assert rp.verdict(bug_free)[0] is False
    unfixed = {**batch, "eos": batch["first_pad"]}
    assert rp.verdict(unfixed)[1] is False


def test_lambda_sweep_bug_equals_gamma_lambda():
    rows = rp.lambda_sweep(SCORES, MASK, [0.0, 0.5, 1.0])
    assert [r["bug, GAE over every position"] for r in rows] == pytest.approx([0.0, 0.5, 1.0], abs=1e-6)
    assert all(r["fix"] == pytest.approx(1.0) for r in rows)


def test_figure_metrics_and_explorer(batch, tmp_path):
    rows = rp.lambda_sweep(SCORES, MASK, [0.5, 0.95])
    fig = rp.figure_reward_position(batch, rows)
    assert len(fig.axes) == 3 and all(ax.has_data() for ax in fig.axes)
    assert legibility.check_figure(fig).problems() == []
    assert "γλ × the score" in rp.reward_position_note(batch, rows)
    plt.close(fig)
    written = written_metrics(rp.metrics(batch, rows), tmp_path)
    assert written["reproduced"] is True and set(written["metrics"]) == {"placement", "lambda_sweep"}
    assert written["headline"]["fix"] == pytest.approx(1.0)
    assert "rewards the EOS" in rp.headline_sentence(batch)
    explorer = rp.example_explorer(length=4, width=7, lam=0.95)
    assert explorer.renders == 1 and explorer.last["bug, GAE over every position"][3] == pytest.approx(0.95)
    explorer.controls["lam"].value = 0.5
    assert explorer.renders == 2 and explorer.last["bug, GAE over every position"][3] == pytest.approx(0.5)


def test_a_batch_without_any_stopped_response_says_why_it_cannot_show_the_pitfall(batch):
    assert rp.not_shown(batch) is None  # the fixture's batch has padded rows
    full = torch.ones(4, 5)  # every response ran to the budget: no pad anywhere
    placed = rp.placement(torch.ones(4), full)
    assert rp.verdict(placed)[0] is False and "none of the 4 sampled responses stopped" in rp.not_shown(placed)
    assert rp.metrics(placed, [])["not_shown"] == rp.not_shown(placed)
