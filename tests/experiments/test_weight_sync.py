"""experiments.weight_sync: the per-step record against hand-computed values, the interval guard, and the reason a
trainer never moved."""

import pytest
import torch

from workbench.experiments import weight_sync as ws


def test_step_record_on_hand_values():
    mu = torch.tensor([[-1.0, -2.0, -3.0]])
    pi = torch.tensor([[-1.5, -1.0, -9.0]])
    pi0 = torch.tensor([[-1.0, -1.0, -1.0]])
    record = ws.step_record(4, mu, pi, pi0, torch.tensor([[1, 1, 0]]))  # the third token is padding
    assert record == {"step": 4, "gap": pytest.approx(0.75), "max_gap": pytest.approx(1.0), "kl": pytest.approx(-0.25),
                      "drift": pytest.approx(0.25), "tokens": 2}


def test_sync_interval_must_be_positive():
    with pytest.raises(ValueError, match="sync_interval=0"):
        ws.sync_training(None, None, None, [], steps=1, sync_interval=0, push=lambda t, s: None)


def test_no_update_reason():
    moved = [[{"reward": 0.5, "reward_spread": 0.3}], [{"reward": 0.0, "reward_spread": 0.0}]]
    assert ws.no_update_reason([moved]) is None
    frozen = [[[{"reward": 0.0, "reward_spread": 0.0}] * 3]]
    assert "every REINFORCE advantage is 0" in ws.no_update_reason(frozen)
    assert ws.no_update_reason([]) is None
