"""STAND-IN for ``flash_attn.bert_padding`` (see ../README.md): gather/scatter of the non-padding tokens."""

import torch
import torch.nn.functional as F

try:  # flash-attn re-exports einops' rearrange; OpenRLHF imports it from here
    from einops import rearrange  # noqa: F401
except ImportError:  # environments without einops (the S2 probes) do not need it
    rearrange = None


def index_first_axis(x, indices):
    return x.reshape(x.shape[0], -1)[indices].reshape(-1, *x.shape[1:])


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """``[B, S, ...]`` -> (tokens ``[nnz, ...]``, indices, cu_seqlens, max_seqlen, seqused), flash-attn 2.7+ order."""
    all_masks = (attention_mask + unused_mask) if unused_mask is not None else attention_mask
    seqlens = all_masks.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return flat[indices], indices, cu_seqlens, int(seqlens.max()), used


def pad_input(hidden_states, indices, batch, seqlen):
    out = torch.zeros(batch * seqlen, *hidden_states.shape[1:], device=hidden_states.device, dtype=hidden_states.dtype)
    out[indices] = hidden_states
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
