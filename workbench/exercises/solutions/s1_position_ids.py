def position_ids(attention_mask):
    """The position of each real token among the real tokens of its row: cumsum(mask) − 1.

    Padding positions get 0 (any valid embedding index would do: the attention mask hides them).
    """
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp_min(0)
