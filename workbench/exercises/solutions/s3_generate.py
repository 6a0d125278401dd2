import torch


def generate(model, input_ids, attention_mask, max_new_tokens, stop_ids):
    """Greedy decoding of a left-padded batch; stops once every row has produced a stop id.

    After its stop, a row continues with model.config.pad_token_id (attention mask 0).
    """
    pad_id = model.config.pad_token_id
    stops = torch.tensor(list(stop_ids), device=input_ids.device)
    ids, mask = input_ids, attention_mask
    finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    for _ in range(max_new_tokens):
        positions = (mask.long().cumsum(-1) - 1).clamp_min(0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
        token = logits.argmax(-1)
        token = torch.where(finished, torch.full_like(token, pad_id), token)
        ids = torch.cat([ids, token[:, None]], dim=1)
        mask = torch.cat([mask, (~finished).long()[:, None].to(mask.dtype)], dim=1)
        finished = finished | torch.isin(token, stops)
        if finished.all():
            break
    return ids
