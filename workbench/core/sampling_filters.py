"""Truncated sampling (top-k, top-p) as pure functions on logits, shared by sampler and scorer.

A sampler with ``top_k``/``top_p`` draws from the *processed* distribution: the logits of every
token outside the kept set are set to −inf and the softmax renormalises over the kept set, so a
kept token has probability p(v) / S, where S = Σ_{kept} p is the kept probability mass. An engine
that returns "processed" log-probs (vLLM's ``logprobs_mode="processed_logprobs"``) returns
log p(v) − log S. A trainer that rescores with the full softmax gets log p(v): the importance
ratio at learning rate 0 is exactly S, not 1 (pitfall P14). Scoring with ``filter_logits`` of
the same logits (same temperature, same k and p) gives back the sampler's numbers.

Order and conventions follow Hugging Face's ``generate`` and vLLM: temperature first, then top-k,
then top-p on the renormalised top-k distribution. top-p keeps the smallest set of most likely
tokens whose mass reaches ``top_p`` (a token is kept when the mass strictly before it is below
``top_p``), so the most likely token is always kept. ``top_k=0`` and ``top_p=1.0`` switch a
filter off.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def check_filters(top_k: int, top_p: float) -> None:
    if not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an integer ≥ 0 (0 = off), got {top_k!r}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1.0 = off), got {top_p!r}")


def kept_set(logits: torch.Tensor, *, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Boolean mask of the tokens a top-k/top-p sampler can draw, same shape as ``logits``."""
    check_filters(top_k, top_p)
    logits = logits.float()
    keep = torch.ones_like(logits, dtype=torch.bool)
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        keep &= logits >= kth
    if top_p < 1.0:
        probs = F.softmax(logits.masked_fill(~keep, float("-inf")), dim=-1)
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        keep_sorted = mass_before < top_p
        keep_sorted[..., 0] = True
        keep &= torch.zeros_like(keep).scatter(-1, order, keep_sorted)
    return keep


def filter_logits(logits: torch.Tensor, *, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """``logits`` with every token outside the kept set at −inf (softmax renormalises over the rest)."""
    return logits.float().masked_fill(~kept_set(logits, top_k=top_k, top_p=top_p), float("-inf"))


def kept_mass(logits: torch.Tensor, *, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """S = Σ_{kept} softmax(logits): the full-softmax probability mass the filters keep."""
    probs = F.softmax(logits.float(), dim=-1)
    return (probs * kept_set(logits, top_k=top_k, top_p=top_p)).sum(-1)


def processed_logprobs(logits: torch.Tensor, labels: torch.Tensor, *, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """log-probs of ``labels`` under the processed (filtered, renormalised) distribution.

    Equals log softmax(logits)[label] − log S for a kept label, −inf for a label the sampler
    could not have drawn.
    """
    filtered = filter_logits(logits, top_k=top_k, top_p=top_p)
    return F.log_softmax(filtered, dim=-1).gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1)
