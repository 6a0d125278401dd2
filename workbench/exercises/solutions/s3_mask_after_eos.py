import torch


def mask_after_eos(response_ids, stop_ids):
    """1 up to and including the first stop id of each row, 0 after it; a row without a stop id keeps every token."""
    is_stop = torch.isin(response_ids, torch.tensor(list(stop_ids), dtype=response_ids.dtype, device=response_ids.device))
    stops_before = is_stop.long().cumsum(dim=-1) - is_stop.long()  # stop ids strictly before each position
    return (stops_before == 0).long()
