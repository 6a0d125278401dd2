import torch


def dpo_logps(token_logps, attention_mask, prompt_lengths):
    """Each row's sum of response-token log-probs; rows B..2B−1 share the prompts of rows 0..B−1.

    token_logps[:, t] scores token t+1, so with a prompt of P tokens the response targets are t ≥ P − 1.
    """
    lengths = torch.as_tensor(list(prompt_lengths), device=token_logps.device).repeat(2)[:, None]  # both halves
    t = torch.arange(token_logps.shape[1], device=token_logps.device)[None]
    keep = (t >= lengths - 1) & attention_mask[:, 1:].bool()
    return (token_logps * keep).sum(dim=-1)
