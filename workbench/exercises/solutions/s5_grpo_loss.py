def grpo_loss(per_token_loss, mask):
    """The GRPO paper's loss: each response's mean over its real tokens, then the mean over responses.

    A fully masked row has length 0: its length is clamped at 1 (it sums to 0) and it is left out of the mean.
    """
    mask = mask.to(per_token_loss.dtype)
    lengths = mask.sum(dim=-1)
    per_sequence = (per_token_loss * mask).sum(dim=-1) / lengths.clamp_min(1)
    rows = (lengths > 0).to(per_token_loss.dtype)
    return (per_sequence * rows).sum() / rows.sum().clamp_min(1)
