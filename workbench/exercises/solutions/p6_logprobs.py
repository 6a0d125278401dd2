import torch


def logprobs(logits, ids, temperature):
    """log softmax(logits / τ) at ids, in float32 whatever the logits' dtype (upcast before dividing)."""
    scaled = logits.float() / temperature
    return torch.log_softmax(scaled, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
