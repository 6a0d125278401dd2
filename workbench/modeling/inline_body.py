"""The prefix-tree training forward's transformer body without ``model.model(...)``: Llama/Qwen2 layers as plain ops.

Why: at the workbench's sizes a training forward through ``transformers`` spends about as long in
Python (module dispatch, ``capture_outputs``/config wrappers, the mask builder, per-layer
attention-interface look-ups) as in its matmuls; GRPO makes one such call per step, DPO two (policy
and reference). ``body_hidden_states`` runs the same ops on the model's own weights, in the same
order, with autograd: RMSNorm, q/k/v projections, rotary embeddings, the grouped key/value heads
repeated (``repeat_kv``, as transformers' sdpa integration does whenever a mask is passed),
``scaled_dot_product_attention`` under the prefix tree's boolean 4-D mask, the output projection,
the MLP and the final norm. Same kernels on the same shapes, so its hidden states and gradients are
*bitwise* equal to ``model.model(input_ids=…, attention_mask=mask, position_ids=…)``'s
(``tests/modeling/test_inline_body.py``): numbers do not depend on which path ran, and policy,
π_old and reference stay exactly equal at step 0 whichever of them takes it.

Used by ``scoring._tree_scored`` where ``usable(model)`` (the conditions of
``decode.unsupported_reason``: Llama/Qwen2 under sdpa, full attention, static rope, no hooks, no
active attention dropout, and the model in eval mode so that no dropout or gradient checkpointing
is skipped); otherwise the tree forward calls ``model.model(...)``. Hooks that
``workbench.core.observers`` lists as covered (``workbench.watch``'s) do not count: while a listener is
subscribed, each call is reported as the ``forward``/``forward_done`` events of the body call it replaces
(part ``"body"``: the inputs above, ``use_cache=False``; the hidden states with their autograd graph).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workbench.core import observers
from workbench.modeling.decode import _repeat_kv, _rms_norm, _rotate_half, unsupported_reason

observers.register_forward_implementation(__file__)  # a watch's call site is the scorer that called it


def usable(model) -> bool:
    """True when ``body_hidden_states`` computes exactly what ``model.model(...)`` would."""
    return not model.training and unsupported_reason(model) is None


def body_hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """``model.model(input_ids, attention_mask=<boolean (B, 1, T, T)>, position_ids).last_hidden_state``, op for op."""
    if attention_mask.dim() != 4 or attention_mask.dtype != torch.bool:
        raise ValueError("body_hidden_states takes a boolean (B, 1, T, T) attention mask (scoring.prefix_tree's)")
    if observers.listening():  # reported as the model.model(...) call it replaces
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids, "use_cache": False}
        return observers.forward_call(model, "body", inputs, lambda: _hidden_states(model, input_ids, attention_mask, position_ids),
                                      lambda hidden: {"last_hidden_state": hidden})
    return _hidden_states(model, input_ids, attention_mask, position_ids)


def _hidden_states(model, input_ids, attention_mask, position_ids) -> torch.Tensor:
    inner = model.model
    batch, length = input_ids.shape
    embed = inner.embed_tokens
    x = F.embedding(input_ids, embed.weight, embed.padding_idx)
    cos, sin = inner.rotary_emb(x, position_ids)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    for layer in inner.layers[: model.config.num_hidden_layers]:
        a, mlp = layer.self_attn, layer.mlp
        shape = (batch, length, -1, a.head_dim)
        h = _rms_norm(layer.input_layernorm, x)
        q = F.linear(h, a.q_proj.weight, a.q_proj.bias).view(shape).transpose(1, 2)
        k = F.linear(h, a.k_proj.weight, a.k_proj.bias).view(shape).transpose(1, 2)
        v = F.linear(h, a.v_proj.weight, a.v_proj.bias).view(shape).transpose(1, 2)
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
        groups = a.num_key_value_groups
        out = F.scaled_dot_product_attention(q, _repeat_kv(k, groups), _repeat_kv(v, groups), attn_mask=attention_mask,
                                             dropout_p=0.0, scale=a.scaling, is_causal=False)
        out = out.transpose(1, 2).contiguous().reshape(batch, length, -1).contiguous()
        x = x + F.linear(out, a.o_proj.weight, a.o_proj.bias)
        h = _rms_norm(layer.post_attention_layernorm, x)
        gate = F.linear(h, mlp.gate_proj.weight, mlp.gate_proj.bias)
        up = F.linear(h, mlp.up_proj.weight, mlp.up_proj.bias)
        x = x + F.linear(mlp.act_fn(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
    return _rms_norm(inner.norm, x)
