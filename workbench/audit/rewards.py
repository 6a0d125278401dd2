"""Checks of a user's reward code: where a score lands (P25) and which token a reward model pools (P24).

``check_reward_placement`` calls a reward-shaping function on crafted response masks (rows that end
early, one that fills the width) and asks where each row's score went: on the last real token (the
EOS), or one later (TRL's PPO before #3750: the first pad, masked away afterwards).

``check_reward_pooling`` calls a reward model's scoring function on texts alone and inside
left-padded and right-padded batches next to a longer text: a sequence-classification head that
pools at "first pad − 1" (transformers before PR #35911) scores a text differently by its batch
when pad = EOS, or when an EOS sits inside the text.

Torch + standard library only (the peer lab runs these in other environments).
"""

from __future__ import annotations

import torch

from workbench.audit.result import AuditResult
from workbench.audit.signatures import first_call, require_tensor

PLACEMENT_EXPECTED = "reward_fn(scores: Tensor[B], response_mask: Tensor[B, R]) -> Tensor[B, R] per-token rewards"
POOLING_EXPECTED = "score_fn(input_ids: Tensor[B, T], attention_mask: Tensor[B, T]) -> Tensor[B] (or [B, 1]) scores"
PLACEMENT_LENGTHS = (1, 3, 5, 6)  # response lengths in a width of 6: three rows end early, one fills the width


def _placement_batch(lengths=PLACEMENT_LENGTHS, width: int = 6):
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    scores = torch.tensor([2.0 + i for i in range(len(lengths))])  # distinct, non-zero
    return scores, mask


def check_reward_placement(reward_fn) -> AuditResult:
    """Pass when every row's score sits on its last real response token.

    ``reward_fn(scores, response_mask)`` builds the per-token rewards your PPO feeds to GAE (without
    the KL term, or with β = 0); the response mask is right-padded, 1 on real tokens (EOS included).
    ``details["offsets"]``: per row, the index holding the score minus the last real index (``None``
    when the score is nowhere); ``value``: the largest |offset| (−1 when a score is missing).
    """
    scores, mask = _placement_batch()
    out = first_call(reward_fn, "check_reward_placement", PLACEMENT_EXPECTED, scores, mask)
    out = require_tensor(out, "check_reward_placement", PLACEMENT_EXPECTED, tuple(mask.shape)).detach().float().cpu()
    last = mask.sum(-1) - 1
    offsets = []
    for row in range(mask.shape[0]):
        where = (out[row] - scores[row]).abs() < 1e-6 * scores[row].abs()
        offsets.append(int(where.nonzero()[0, 0] - last[row]) if where.any() else None)
    worst = -1 if None in offsets else max(abs(o) for o in offsets)
    passed = worst == 0
    if passed:
        convention = "the score sits on the last real response token (the EOS)"
    elif None in offsets:
        convention = "a row's score is missing from the rewards (written on a masked position and zeroed?)"
    else:
        convention = f"the score sits {worst} token(s) after the EOS on rows with padding (TRL PPO before #3750)"
    details = {"metric": "max |score index − EOS index|", "value": worst, "offsets": offsets, "lengths": list(PLACEMENT_LENGTHS),
               "plot": {"kind": "bar", "x": [f"len {n}" for n in PLACEMENT_LENGTHS],
                        "series": {"score index − EOS index": [o if o is not None else -1 for o in offsets]},
                        "xlabel": "response (width 6)", "ylabel": "offset (−1: missing)", "title": convention}}
    return AuditResult("reward_placement", passed, convention, details)
