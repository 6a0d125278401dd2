import torch


def k3(logp, ref_logp):
    """k3 = exp(r) − r − 1 with r = ref_logp − logp: unbiased, ≥ 0, 0 where the policies agree.

    expm1 keeps precision for tiny gaps, the final clamp removes rounding below 0, and the log-ratio is clamped to
    [−20, 20] so that a huge gap stays finite in float32 (as verl's low_var_kl).
    """
    r = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.expm1(r) - r).clamp_min(0)
