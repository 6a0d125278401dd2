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


def _padded(rows: list[list[int]], pad_id: int, side: str):
    width = max(len(r) for r in rows)
    ids = [[pad_id] * (width - len(r)) + r if side == "left" else r + [pad_id] * (width - len(r)) for r in rows]
    mask = [[0] * (width - len(r)) + [1] * len(r) if side == "left" else [1] * len(r) + [0] * (width - len(r)) for r in rows]
    return torch.tensor(ids), torch.tensor(mask)


def check_reward_pooling(score_fn, tokenizer, *, texts=("1+2=3", "12+34=46 and 46-4=42"), pad_id: int | None = None,
                         tolerance: float = 1e-4) -> AuditResult:
    """Pass when each text scores the same alone and inside left- and right-padded batches with a longer text.

    ``score_fn(input_ids, attention_mask)`` returns your reward model's scores; ``tokenizer`` encodes the
    ``texts`` (each followed by its EOS). Padding uses ``pad_id`` (default: the tokenizer's pad id; pass
    ``tokenizer.eos_token_id`` to test the pad = EOS set-up that transformers < 4.49 mis-pooled).
    ``value``: the largest |score alone − score in a batch|; ``tolerance`` is float noise.
    """
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if pad_id is None else pad_id
    rows = [list(tokenizer.encode(t, add_special_tokens=False)) + [eos] for t in texts]

    def scores(ids, mask):
        out = first_call(score_fn, "check_reward_pooling", POOLING_EXPECTED, ids, mask)
        out = require_tensor(out, "check_reward_pooling", POOLING_EXPECTED)
        return out.detach().float().reshape(ids.shape[0]).cpu()

    alone = torch.cat([scores(torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long)) for r in rows])
    deltas = {side: (scores(*_padded(rows, pad, side)) - alone).abs().tolist() for side in ("left", "right")}
    worst = max(max(v) for v in deltas.values())
    passed = worst <= tolerance
    moved = [side for side, v in deltas.items() if max(v) > tolerance]
    convention = ("a text scores the same alone and in a padded batch" if passed else
                  f"a text's score changes with its batch under {' and '.join(moved)} padding (pooling at 'first pad − 1'?)")
    details = {"metric": "max |score alone − in batch|", "value": worst, "pad_is_eos": pad == eos, "deltas": deltas,
               "plot": {"kind": "bar", "x": [f"{side} pad, text {i}" for side in deltas for i in range(len(rows))],
                        "series": {"|Δ score|": [d for v in deltas.values() for d in v]}, "threshold": tolerance,
                        "xlabel": "batch", "ylabel": "|score alone − in batch|", "title": convention}}
    return AuditResult("reward_pooling", passed, convention, details)
