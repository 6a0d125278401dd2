import torch


def left_pad(input_ids, attention_mask, pad_id):
    """Move each row's real tokens (in order) to the right end; padding (pad_id, mask 0) goes to the left."""
    ids = torch.full_like(input_ids, pad_id)
    mask = torch.zeros_like(attention_mask)
    width = input_ids.shape[1]
    for row in range(input_ids.shape[0]):
        real = input_ids[row][attention_mask[row].bool()]
        ids[row, width - len(real):] = real
        mask[row, width - len(real):] = 1
    return ids, mask
