"""The sampler's decode step without ``model(...)``: a static KV cache and the layers' maths inline.

Why: at the workbench's sizes a decode forward through ``transformers`` costs ~1.3 ms of Python per
call (module dispatch, config look-ups, cache and mask objects) for a few hundred microseconds of
matmuls; the sampler makes one per token. ``StaticDecoder`` takes the prompt's KV cache from the
ordinary prefill forward, copies it once into buffers preallocated for the whole batch
(``prompt + max_new_tokens`` positions), and then runs each decode step as plain tensor ops on the
model's own weights: RMSNorm, the q/k/v projections, rotary embeddings (cos/sin of every future
position computed once), one cache write, ``scaled_dot_product_attention`` on the filled part of
the buffer, the MLP, the final norm and the LM head. No new tensor grows per step.

It mirrors ``transformers``' Llama/Qwen2 code op by op (same kernels, same shapes, the same GQA
handling as its sdpa integration for one query token: no mask when nothing is padded, otherwise a
boolean (B, 1, 1, L) mask with the query heads grouped per key/value head), so its logits equal
``model(...)``'s to float noise (tests/modeling/test_decode.py: tokens equal, log-probs ≤ 1e-5).

``unsupported_reason(model)`` says why a model must go through ``model(...)`` instead: another
architecture (GPT-2's learned positions, ...), another attention back-end (eager, flash: pitfall
S2 compares them, so their numbers must come from their own kernels), sliding-window layers, a
rope type that changes with the sequence length, dropout active, or hooks on a module (P7's
dropout probes and the audit observe the forward through hooks, which this path would skip).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM")
STATIC_ROPE = ("default", "linear", "llama3")


def _has_hooks(model) -> bool:
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def unsupported_reason(model) -> str | None:
    """None when ``StaticDecoder`` can run ``model``'s decode steps, else why not (one phrase)."""
    name = type(model).__name__
    if name not in SUPPORTED:
        return f"architecture {name} (supported: {', '.join(SUPPORTED)})"
    config = model.config
    if config._attn_implementation != "sdpa":
        return f"attn_implementation={config._attn_implementation!r} (the static decoder runs sdpa only)"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return "sliding-window layers"
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope not in STATIC_ROPE:
        return f"rope_type={rope!r} (its frequencies depend on the sequence length)"
    if model.training and getattr(config, "attention_dropout", 0.0) > 0:
        return "attention dropout active (train mode)"
    if _has_hooks(model):
        return "forward hooks registered on the model"
    return None


def _rms_norm(norm, x: torch.Tensor) -> torch.Tensor:
    """``LlamaRMSNorm``/``Qwen2RMSNorm.forward``, op for op."""
    dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + norm.variance_epsilon)
    return norm.weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class StaticDecoder:
    """Decode steps of a Llama/Qwen2 model on a preallocated KV cache (see module doc).

    ``cache``: the ``DynamicCache`` the prefill forward returned (rows in the batch's order);
    ``prompt_mask``: (B, P), left-padded; ``next_position``: (B, 1) position of the first new
    token; ``max_new_tokens``: how many tokens may follow the prompt.
    """

    def __init__(self, model, cache, prompt_mask: torch.Tensor, next_position: torch.Tensor, max_new_tokens: int):
        self.model, inner = model, model.model
        self.layers = list(inner.layers[: model.config.num_hidden_layers])
        batch, prompt_len = prompt_mask.shape
        self.prompt_len = prompt_len
        self.keys, self.values = [], []
        for layer_cache in cache.layers[: len(self.layers)]:
            k, v = layer_cache.keys, layer_cache.values
            shape = (batch, k.shape[1], prompt_len + max_new_tokens, k.shape[3])
            self.keys.append(k.new_empty(shape))
            self.values.append(v.new_empty(shape))
            self.keys[-1][:, :, :prompt_len] = k
            self.values[-1][:, :, :prompt_len] = v
        attention = self.layers[0].self_attn
        self.head_dim, self.scaling, self.groups = attention.head_dim, attention.scaling, attention.num_key_value_groups
        # what transformers' mask builder passes to sdpa for one query token: nothing when no row is padded
        # (sdpa then takes the grouped heads itself), else a boolean mask over the cache's columns
        if bool(prompt_mask.all()):
            self.mask = None
        else:
            self.mask = torch.cat([prompt_mask.bool(), prompt_mask.new_ones((batch, max_new_tokens), dtype=torch.bool)], dim=1)
            self.mask = self.mask[:, None, None, :]
        positions = next_position + torch.arange(max_new_tokens, device=next_position.device)
        dtype = inner.embed_tokens.weight.dtype
        self.cos, self.sin = inner.rotary_emb(torch.empty(0, dtype=dtype, device=positions.device), positions)
        self.step_index = 0

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (B,); the next-token logits (B, V)."""
        s, column = self.step_index, self.prompt_len + self.step_index
        self.step_index += 1
        inner = self.model.model
        x = F.embedding(token[:, None], inner.embed_tokens.weight, inner.embed_tokens.padding_idx)
        cos, sin = self.cos[:, None, s : s + 1], self.sin[:, None, s : s + 1]
        mask = None if self.mask is None else self.mask[..., : column + 1]
        batch = token.shape[0]
        for i, layer in enumerate(self.layers):
            attention = layer.self_attn
            h = _rms_norm(layer.input_layernorm, x)
            shape = (batch, 1, -1, self.head_dim)
            q = F.linear(h, attention.q_proj.weight, attention.q_proj.bias).view(shape).transpose(1, 2)
            k = F.linear(h, attention.k_proj.weight, attention.k_proj.bias).view(shape).transpose(1, 2)
            v = F.linear(h, attention.v_proj.weight, attention.v_proj.bias).view(shape).transpose(1, 2)
            q = (q * cos) + (_rotate_half(q) * sin)
            k = (k * cos) + (_rotate_half(k) * sin)
            self.keys[i][:, :, column : column + 1] = k
            self.values[i][:, :, column : column + 1] = v
            keys, values = self.keys[i][:, :, : column + 1], self.values[i][:, :, : column + 1]
            if mask is None:
                out = F.scaled_dot_product_attention(q, keys, values, scale=self.scaling, enable_gqa=self.groups > 1)
            elif self.groups > 1:  # transformers' pack_gqa: the query heads of one key/value head side by side
                out = F.scaled_dot_product_attention(q.reshape(batch, -1, self.groups, self.head_dim), keys, values,
                                                     attn_mask=mask, scale=self.scaling)
            else:
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling)
            out = out.reshape(batch, -1, 1, self.head_dim).transpose(1, 2).reshape(batch, 1, -1)  # (undoes the grouping)
            x = x + F.linear(out, attention.o_proj.weight, attention.o_proj.bias)
            mlp = layer.mlp
            h = _rms_norm(layer.post_attention_layernorm, x)
            x = x + F.linear(mlp.act_fn(F.linear(h, mlp.gate_proj.weight, mlp.gate_proj.bias)) * F.linear(h, mlp.up_proj.weight,
                             mlp.up_proj.bias), mlp.down_proj.weight, mlp.down_proj.bias)
        x = _rms_norm(inner.norm, x)
        head = self.model.lm_head
        return F.linear(x[:, -1], head.weight, head.bias)
