"""Bias and variance of a gradient estimator, measured from paired batches (notebook 36's "gradient estimator trials").

An estimator (a rollout correction applied to stale or low-precision samples) and the on-policy reference are computed
on the same M batches drawn with the same random numbers, so batch m of each is paired. ``bias_variance`` gives the
debiased squared bias and the variance relative to ‖g‖², with delete-one jackknife standard errors computed in closed
form from Gram matrices (no M × D copies), and the Gaussian s.e. under "no bias" that the z test uses.
"""

from __future__ import annotations

import math

import torch


def _gram_statistics(gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From the Gram matrix (M, M) of M vectors v_m: (the unbiased ‖E v‖² on all of them, the same with each left out in
    turn (M,)). ‖E v‖² is the U-statistic Σ_{i≠j} v_i·v_j / (n (n − 1)) (= ‖v̄‖² − tr Σ̂ / n, the squared mean debiased
    by its own noise)."""
    m = gram.shape[0]
    total, trace, rows, diagonal = gram.sum(), gram.trace(), gram.sum(1), gram.diagonal()
    full = (total - trace) / (m * (m - 1))
    left_out = (total - 2 * rows + diagonal - (trace - diagonal)) / ((m - 1) * (m - 2))
    return full, left_out


def _gram_trace_covariance(gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From the Gram matrix (M, M) of M vectors: (tr Σ̂, their sample covariance's trace, on all of them; the same with
    each left out in turn (M,))."""
    m = gram.shape[0]
    total, trace, rows, diagonal = gram.sum(), gram.trace(), gram.sum(1), gram.diagonal()
    full = (trace - total / m) / (m - 1)
    left_out = ((trace - diagonal) - (total - 2 * rows + diagonal) / (m - 1)) / (m - 2)
    return full, left_out


def _jackknife_se(left_out: torch.Tensor) -> float:
    """The delete-one jackknife's standard error from a statistic's M leave-one-out values."""
    m = left_out.shape[0]
    return float(((left_out - left_out.mean()) ** 2).sum() * (m - 1) / m) ** 0.5


def bias_variance(estimates: torch.Tensor, reference: torch.Tensor) -> dict:
    """Bias and variance of a gradient estimator from its per-batch estimates (M, D) and on-policy estimates of the same
    batches (M, D): drawn with the same random numbers (``draw_responses``), so batch m of each is paired. The exact
    gradient g is the reference's mean; everything is relative to ‖g‖², itself estimated from the reference batches
    and debiased by their own noise (‖ȳ‖² − tr Σ̂_y / M).

    ``bias2``: the debiased squared bias ‖d̄‖² − tr Σ̂_d / M relative to ‖g‖², d_m the paired differences (unbiased for
    ‖b‖², so it may come out below 0 where there is none). ``variance``: one batch's tr Σ̂ of the estimator relative to
    ‖g‖²; ``mse`` (per batch) = squared bias + variance. ``bias2_se`` and ``variance_se``: delete-one jackknife over the
    batches (each batch left out with its paired reference batch), so they include the noise of ‖g‖²'s estimate and, for
    the bias, the term 4 bᵀ Σ_d b / M its noise has once b ≠ 0 — what the Gaussian s.e. under no bias leaves out
    (``bias2_null_se`` = √(2 tr Σ_d²) / M, from the differences' Gram matrix, about the observed bias's value only where
    it is 0). ``z`` = bias2 / bias2_null_se: the test of "no bias", whose null distribution that s.e. describes.
    Needs M ≥ 3 batches (the jackknife leaves one out of a statistic of pairs)."""
    x, y = estimates.double(), reference.double()
    m = x.shape[0]
    if m < 3:
        raise ValueError(f"bias_variance needs at least 3 paired batches, got {m}: raise trials")
    d = x - y
    dc = d - d.mean(0)
    bias2, bias2_left_out = _gram_statistics(d @ d.T)
    norm2, norm2_left_out = _gram_statistics(y @ y.T)
    variance, variance_left_out = _gram_trace_covariance(x @ x.T)
    null_se = math.sqrt(2 * float(((dc @ dc.T) ** 2).sum())) / ((m - 1) * m)
    bias2, norm2, variance = float(bias2), float(norm2), float(variance)
    if not norm2 > 0 or not bool((norm2_left_out > 0).all()):
        # no reward signal (every advantage 0), or too little to leave a batch out: no gradient to be biased
        return {"bias2": 0.0, "bias2_se": 0.0, "bias2_null_se": 0.0, "z": 0.0, "variance": 0.0, "variance_se": 0.0, "mse": 0.0,
                "relative_bias": 0.0, "batches": m, "no_signal": True}
    return {"bias2": bias2 / norm2, "bias2_se": _jackknife_se(bias2_left_out / norm2_left_out),
            "bias2_null_se": null_se / norm2, "z": bias2 / null_se if null_se > 0 else 0.0, "variance": variance / norm2,
            "variance_se": _jackknife_se(variance_left_out / norm2_left_out), "mse": (bias2 + variance) / norm2,
            "relative_bias": math.sqrt(max(bias2, 0.0) / norm2), "batches": m, "no_signal": False}
