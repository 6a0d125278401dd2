import torch


def whiten(values, mask):
    """(x − mean) / sqrt(var + eps) over the real tokens of the whole batch; padding positions → 0."""
    eps = 1e-8
    real = mask.bool()
    x = torch.where(real, values, torch.zeros_like(values))  # padding may hold anything, even NaN
    n = real.sum().clamp_min(1)
    mean = x.sum() / n
    var = torch.where(real, (x - mean) ** 2, torch.zeros_like(x)).sum() / n
    return torch.where(real, (x - mean) * torch.rsqrt(var + eps), torch.zeros_like(x))
