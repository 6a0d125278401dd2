"""STAND-IN for flash-attn (see ../README.md): exact scaled-dot-product equivalents of its kernels.

``flash_attn_func`` / ``flash_attn_varlen_func`` follow flash-attn >= 2.1 semantics: q ``[B, S, H, D]``
(varlen: ``[total, H, D]`` with ``cu_seqlens``), grouped-query k/v, and a causal mask aligned to the
bottom-right corner when the query is shorter than the key. No dropout (``dropout_p`` must be 0).
"""

import torch

STANDIN = True
__version__ = "2.8.3+workbench.standin"


def _attend(q, k, v, softmax_scale=None, causal=False):
    """q ``[Sq, H, D]``, k/v ``[Sk, Hkv, D]`` -> ``[Sq, H, D]``."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads != kv_heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    if causal:
        sq, sk = q.shape[0], k.shape[0]
        allowed = torch.arange(sk, device=q.device)[None, :] <= torch.arange(sq, device=q.device)[:, None] + (sk - sq)
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)


def _no_dropout(dropout_p):
    if dropout_p:
        raise NotImplementedError("the flash_attn stand-in implements dropout_p=0 only")


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, **kwargs):
    _no_dropout(dropout_p)
    return torch.stack([_attend(q[b], k[b], v[b], softmax_scale, causal) for b in range(q.shape[0])])


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, **kwargs):
    _no_dropout(dropout_p)
    out = torch.empty_like(q)
    for i in range(len(cu_seqlens_q) - 1):
        qs, qe = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1])
        ks, ke = int(cu_seqlens_k[i]), int(cu_seqlens_k[i + 1])
        out[qs:qe] = _attend(q[qs:qe], k[ks:ke], v[ks:ke], softmax_scale, causal)
    return out
