"""Audit checks of reward code: where the score lands (P25) and which token a reward model pools (P24)."""

import pytest
import torch

from workbench.audit import check_reward_placement
from workbench.core.errors import AuditSignatureError
from workbench.trainers.ppo import last_token_rewards


def _trl_style(scores, mask):
    """TRL's PPO before #3750: the score at first pad, kept (GAE over every position)."""
    rewards = torch.zeros(mask.shape)
    last = mask.sum(-1) - 1
    end = torch.where(last + 1 < mask.shape[-1], last + 1, last)
    rewards[torch.arange(mask.shape[0]), end] = scores
    return rewards


def test_reward_placement_passes_on_the_eos_and_fails_one_late():
    good = check_reward_placement(lambda s, m: last_token_rewards(s, m))
    assert good.passed and good.value == 0 and good.details["offsets"] == [0, 0, 0, 0]
    late = check_reward_placement(_trl_style)
    assert not late.passed and late.details["offsets"] == [1, 1, 1, 0] and "after the EOS" in late.convention


def test_reward_placement_names_a_dropped_score():
    dropped = check_reward_placement(lambda s, m: last_token_rewards(s, m, "first_pad"))  # written on a pad, then masked
    assert not dropped.passed and dropped.value == -1 and dropped.details["offsets"][:3] == [None, None, None]
    assert "missing" in dropped.convention


def test_reward_placement_refuses_a_wrong_shape():
    with pytest.raises(AuditSignatureError, match="shape"):
        check_reward_placement(lambda s, m: s)


class _ToyTokenizer:
    eos_token_id, pad_token_id = 2, 0

    def encode(self, text, add_special_tokens=False):
        return [3 + (ord(c) % 20) for c in text]


def _toy_score_fn(rule):
    """A 'reward model' whose score is the pooled token id times 0.1 (pooling is all it does)."""
    from workbench.pitfalls.nb24_reward_model_pooling import pool_index

    def score_fn(ids, mask, pad_id=2):
        return ids[torch.arange(ids.shape[0]), pool_index(ids, mask, pad_id, rule)].float() * 0.1

    return score_fn


def test_reward_pooling_fails_first_pad_minus_one_with_pad_equal_eos():
    from workbench.audit import check_reward_pooling

    tok = _ToyTokenizer()
    bug = check_reward_pooling(_toy_score_fn("first pad − 1"), tok, pad_id=tok.eos_token_id)
    assert not bug.passed and bug.value > 0.05 and max(bug.details["deltas"]["left"]) > 0 and bug.details["pad_is_eos"]
    fix = check_reward_pooling(_toy_score_fn("rightmost attended"), tok, pad_id=tok.eos_token_id)
    assert fix.passed and fix.value == 0.0
