"""Pitfall P9: which KL estimator, and where it goes (reward or loss).

On a tiny model the exact per-token KL(π‖π_ref) = Σ_v π(v)·(log π(v) − log π_ref(v)) is a sum over
64 tokens, so every estimator can be judged exactly at each context, with no sampling noise:

* value: the estimator's mean over v ~ π (bias = mean − exact KL) and its standard deviation;
* gradient: what it contributes when differentiated *as a loss term* at sampled tokens,
  E_v[∇ k(r_v)] = Σ_v π(v) k'(r_v) ∇log π(v), versus the exact ∇KL — and versus k1 used as a
  *reward* with the score function, E_v[k1(r_v) ∇log π(v)].

With r = log π − log π_ref: k1 in the loss has k' = 1 → Σ π ∇log π = 0 (no gradient at all);
k2 has k' = r → exactly ∇KL; k3 has k' = 1 − π_ref/π → −Σ π_ref ∇log π, the gradient of the
*forward* KL(π_ref‖π). k1 as a reward gives Σ π r ∇log π = ∇KL. (Tang & Munos 2025.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workbench.scoring import forward

ESTIMATORS = ("k1", "k2", "k3")
GRADIENT_VARIANTS = ("k1 in reward", "k1 in loss", "k2 in loss", "k3 in loss")


def estimator_values(log_ratio: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    return torch.exp(-log_ratio) - 1 + log_ratio


def _distributions(policy, reference, input_ids, attention_mask, positions: torch.Tensor):
    """log π and log π_ref (N, V) at the selected (row, column) contexts."""
    logp = F.log_softmax(forward(policy, input_ids, attention_mask).float(), -1)[positions[:, 0], positions[:, 1]]
    with torch.no_grad():
        ref = F.log_softmax(forward(reference, input_ids, attention_mask).float(), -1)[positions[:, 0], positions[:, 1]]
    return logp, ref


def value_stats(policy, reference, input_ids, attention_mask, positions) -> dict:
    """Exact KL and, per estimator, its exact mean, bias and standard deviation over v ~ π (averaged over contexts)."""
    with torch.no_grad():
        logp, ref = _distributions(policy, reference, input_ids, attention_mask, positions)
        probs = logp.exp()
        log_ratio = logp - ref
        exact = (probs * log_ratio).sum(-1)
        out = {"exact_kl": float(exact.mean())}
        for kind in ESTIMATORS:
            values = estimator_values(log_ratio, kind)
            mean = (probs * values).sum(-1)
            std = ((probs * (values - mean[:, None]) ** 2).sum(-1)).sqrt()
            out[kind] = {"mean": float(mean.mean()), "bias": float((mean - exact).mean()), "std": float(std.mean())}
    return out


def _flat_grad(model, scalar) -> torch.Tensor:
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(scalar, params, retain_graph=True, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


def gradient_comparison(policy, reference, input_ids, attention_mask, positions) -> dict:
    """Cosine similarity and norm ratio of each variant's expected gradient with the exact ∇KL."""
    logp, ref = _distributions(policy, reference, input_ids, attention_mask, positions)
    probs = logp.exp().detach()
    log_ratio = (logp - ref).detach()
    exact = _flat_grad(policy, (logp.exp() * (logp - ref)).sum(-1).mean())
    # surrogates whose gradient equals the expected gradient Σ_v π(v)·c(v)·∇log π(v)
    coefficients = {
        "k1 in reward": log_ratio,  # score function with reward k1
        "k1 in loss": torch.ones_like(log_ratio),  # d k1 / d log π = 1
        "k2 in loss": log_ratio,  # d k2 / d log π = r
        "k3 in loss": 1 - torch.exp(-log_ratio),  # d k3 / d log π = 1 − π_ref/π
    }
    out = {}
    for name, coefficient in coefficients.items():
        grad = _flat_grad(policy, (probs * coefficient * logp).sum(-1).mean())
        out[name] = {
            "cosine": float(F.cosine_similarity(grad.double(), exact.double(), dim=0)) if grad.norm() > 0 else 0.0,
            "norm_ratio": float(grad.norm() / exact.norm()),
        }
    return out
