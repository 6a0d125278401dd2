"""``rollout_agreement``: two rollouts of the same prompts compared, against hand-built rollouts."""

import math

import torch

from workbench.modeling.rollout import Rollout, rollout_agreement


def _rollout(ids, logprobs, mask=None):
    ids = torch.tensor(ids)
    mask = torch.ones_like(ids) if mask is None else torch.tensor(mask)
    return Rollout(prompt_ids=torch.zeros(ids.shape[0], 1, dtype=torch.long), prompt_mask=torch.ones(ids.shape[0], 1, dtype=torch.long),
                   response_ids=ids, response_mask=mask, rollout_logprobs=torch.tensor(logprobs) * mask,
                   finished=torch.ones(ids.shape[0], dtype=torch.bool), decode_steps=ids.shape[1],
                   tokens_generated=ids.numel(), seconds=0.0)


def test_identical_rollouts_agree_everywhere():
    a = _rollout([[1, 2, 3], [4, 5, 6]], [[-0.5, -1.0, -2.0], [-0.1, -0.2, -0.3]])
    b = _rollout([[1, 2, 3], [4, 5, 6]], [[-0.5, -1.25, -2.0], [-0.1, -0.2, -0.3]])
    assert rollout_agreement(a, b) == {"rows": 2, "identical_rows": 2, "same_tokens": True, "first_divergent_row": None,
                                       "max_abs_logprob_gap": 0.25}


def test_the_gap_counts_only_tokens_sampled_while_the_row_still_agreed():
    # row 1 diverges at its second token: its later gap (9.0) compares different tokens and is not counted;
    # row 0's last token is masked (after EOS) in b only: not counted, and row 0 is not identical (another end)
    a = _rollout([[1, 2, 3], [4, 5, 6]], [[-0.5, -1.0, -2.0], [-0.1, -0.2, -0.3]])
    b = _rollout([[1, 2, 3], [4, 7, 6]], [[-0.75, -1.0, -2.0], [-0.2, -5.0, -9.3]], mask=[[1, 1, 0], [1, 1, 1]])
    agreement = rollout_agreement(a, b)
    assert agreement["identical_rows"] == 0 and agreement["first_divergent_row"] == 0 and not agreement["same_tokens"]
    assert math.isclose(agreement["max_abs_logprob_gap"], 0.25, rel_tol=1e-6)  # row 0's first token; row 1's first: 0.1
    # the same tokens ending elsewhere (row 0) are another response; row 1 keeps its divergence
    assert rollout_agreement(a, _rollout([[1, 2, 3], [4, 5, 6]], [[-0.5, -1.0, -2.0], [-0.1, -0.2, -0.3]],
                                         mask=[[1, 1, 0], [1, 1, 1]]))["first_divergent_row"] == 0


def test_different_widths_are_not_identical():
    a = _rollout([[1, 2, 3]], [[-1.0, -1.0, -1.0]])
    b = _rollout([[1, 2]], [[-1.0, -1.5]])
    agreement = rollout_agreement(a, b)
    assert agreement["identical_rows"] == 0 and agreement["first_divergent_row"] == "lengths differ"
    assert agreement["max_abs_logprob_gap"] == 0.5
    nothing_agrees = rollout_agreement(a, _rollout([[9, 9, 9]], [[-3.0, -3.0, -3.0]]))
    assert nothing_agrees["max_abs_logprob_gap"] == 0.0 and nothing_agrees["first_divergent_row"] == 0
