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
dropout probes and the audit observe the forward through hooks, which this path would skip) — except
hooks *covered* through ``workbench.core.observers`` (``workbench.watch``'s): for those the decoder
reports each call it makes in place of ``model(...)`` (the prefill and every decode step) as the
``forward``/``forward_done`` events that module describes, with the inputs ``model(...)`` would have
received and itself as the KV cache (``get_seq_length``), so a watch sees the same calls either way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workbench.core import observers
from workbench.core.batching import repeated_rows

SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM")
STATIC_ROPE = ("default", "linear", "llama3")
observers.register_forward_implementation(__file__)  # a watch's call site is the decoder's caller


def _has_hooks(model) -> bool:
    """Forward hooks that a path without ``model(...)`` would skip: global ones, and any module hook that no
    ``core.observers`` listener covers (a covered hook's owner gets the forward events instead)."""
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    return any(not observers.covered(hook) for m in model.modules()
               for hooks in (m._forward_hooks, m._forward_pre_hooks) if hooks for hook in hooks.values())


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
        return "forward hooks registered on the model (other than workbench.watch's, which this path reports to)"
    return None


def _rms_norm(norm, x: torch.Tensor) -> torch.Tensor:
    """``LlamaRMSNorm``/``Qwen2RMSNorm.forward``, op for op. On a CPU in float32 through ``F.rms_norm``, whose CPU
    kernel (``_fused_rms_norm``) runs the same ATen ops — pow, mean, add, rsqrt, mul, the weight's mul — from C++:
    bitwise equal, gradients too (tests/modeling/test_decode.py), with 7 fewer calls from Python (~3 µs of 12 per call).
    Elsewhere the op-for-op path: other dtypes cast in another order there, and CUDA has a truly fused kernel."""
    if x.dtype == torch.float32 and norm.weight.dtype == torch.float32 and x.device.type == "cpu":
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + norm.variance_epsilon)
    return norm.weight * x.to(dtype)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, kv heads, T, d) → (B, kv heads × groups, T, d), as transformers' ``repeat_kv``."""
    if groups == 1:
        return x
    b, heads, t, d = x.shape
    return x[:, :, None].expand(b, heads, groups, t, d).reshape(b, heads * groups, t, d)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def cache_columns_mask(prompt_mask: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """(B, 1, 1, P + max_new_tokens) boolean: the columns of the KV cache a decoded token may attend to — the prompt's
    real tokens and every position after the prompt (the decoders cut it at the step's column)."""
    batch = prompt_mask.shape[0]
    allowed = torch.cat([prompt_mask.bool(), prompt_mask.new_ones((batch, max_new_tokens), dtype=torch.bool)], dim=1)
    return allowed[:, None, None, :]


HEAD_CHUNK = 512  # LM-head weight rows per matmul on a CPU (see _head_chunks)


def _head_chunks(weight: torch.Tensor, bias: torch.Tensor | None):
    """The LM head's weight (and bias) as chunks of ``HEAD_CHUNK`` vocabulary rows, or None (one matmul).

    Why: for the decode step's few rows (M = 8, K = 256, N = 32,000 at the benchmark's 11M model) MKL's AVX-512
    sgemm took 13 ms per call on one core here, and the same products as 63 matmuls of 512 weight rows (512 KB each)
    7.3 ms, **bitwise equal** (every output is the same K-long dot product in the same order: measured for
    M = 1-32, K = 256/512/896, chunks of 512-4096 rows, AVX-512 and ``MKL_ENABLE_INSTRUCTIONS=AVX2
    ATEN_CPU_CAPABILITY=avx2``; tests/modeling/test_decode.py). Only on a CPU, from 8,192 vocabulary rows (a GPU
    would pay a launch per chunk; the tiny models' 64-row head is one matmul either way) and with torch on one thread
    (``_head`` checks it per call): with two, MKL splits the whole product otherwise from M = 16 at K = 896 and the
    logits moved by ~1.5e-6 — float noise, but not the plain path's numbers.
    """
    if weight.device.type != "cpu" or weight.shape[0] < 8192:
        return None
    biases = bias.split(HEAD_CHUNK) if bias is not None else [None] * len(weight.split(HEAD_CHUNK))
    return list(zip(weight.split(HEAD_CHUNK), biases, strict=True))


class StaticDecoder:
    """Decode steps of a Llama/Qwen2 model on a preallocated KV cache (see module doc).

    ``cache``: the ``DynamicCache`` the prefill forward returned (rows in the batch's order);
    ``prompt_mask``: (B, P), left-padded; ``next_position``: (B, 1) position of the first new
    token; ``max_new_tokens``: how many tokens may follow the prompt.
    ``share_prefill``: the prompt forward once per distinct prompt row (``sample``'s switch).
    """

    def __init__(self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, position_ids: torch.Tensor, max_new_tokens: int,
                 share_prefill: bool = False):
        self.model = model  # named in the forward events (core.observers) while a listener is subscribed
        inner = model.model
        layers = list(inner.layers[: model.config.num_hidden_layers])
        batch, prompt_len = prompt_mask.shape
        self.prompt_len = prompt_len
        attention = layers[0].self_attn
        self.head_dim, self.scaling, self.groups = attention.head_dim, attention.scaling, attention.num_key_value_groups
        self.layers = []  # per layer: the weights the step reads (no module attribute look-ups per token)
        for layer in layers:
            a, mlp = layer.self_attn, layer.mlp
            shape = (batch, a.k_proj.weight.shape[0] // self.head_dim, prompt_len + max_new_tokens, self.head_dim)
            keys, values = a.k_proj.weight.new_empty(shape), a.v_proj.weight.new_empty(shape)
            projections = ((a.q_proj.weight, a.q_proj.bias), (a.k_proj.weight, a.k_proj.bias), (a.v_proj.weight, a.v_proj.bias),
                           (mlp.gate_proj.weight, mlp.gate_proj.bias), (mlp.up_proj.weight, mlp.up_proj.bias))
            self.layers.append((layer.input_layernorm, projections, (a.o_proj.weight, a.o_proj.bias),
                                layer.post_attention_layernorm, mlp.act_fn, (mlp.down_proj.weight, mlp.down_proj.bias),
                                keys, values))
        self.embedding, self.padding_idx = inner.embed_tokens.weight, inner.embed_tokens.padding_idx
        self.norm, self.head = inner.norm, (model.lm_head.weight, model.lm_head.bias)
        self.head_chunks = _head_chunks(*self.head)
        self.rotary = inner.rotary_emb
        padded = not bool(prompt_mask.all())
        # what transformers' mask builder passes to sdpa for one query token: nothing when no row is padded
        # (sdpa then takes the grouped heads itself), else a boolean mask over the cache's columns
        self.mask = cache_columns_mask(prompt_mask, max_new_tokens) if padded else None
        next_position = position_ids[:, -1:] + 1
        positions = next_position + torch.arange(max_new_tokens, device=next_position.device)
        self.cos, self.sin = self.rotary(torch.empty(0, dtype=self.embedding.dtype, device=positions.device), positions)
        self.step_index = 0
        # the decode steps' inputs as model(...) would get them (prompt mask + ones, one position per step): for the events
        self.positions, self.prompt_mask, self._full_mask = positions, prompt_mask, None
        self.first_logits = self._prefill(prompt_ids, prompt_mask, position_ids, share_prefill)

    def get_seq_length(self) -> int:
        """Positions already in the cache (prompt + decoded tokens), as a ``transformers`` cache reports it."""
        return self.prompt_len + self.step_index

    def _reported(self, inputs: dict, compute):
        """``compute()`` as a ``model(**inputs)`` call that returns this decoder as its cache (core.observers events)."""
        return observers.forward_call(self.model, "model", {**inputs, "use_cache": True}, compute,
                                      lambda _: {"past_key_values": self})

    def _prefill(self, prompt_ids, prompt_mask, position_ids, share: bool) -> torch.Tensor:
        """The prompt forward, its keys and values written into the buffers; the last position's logits (B, V).
        With ``share``, once per distinct prompt row, the results copied to the repeated rows."""
        repeated = repeated_rows(torch.cat([prompt_ids, prompt_mask], dim=1)) if share else None
        if repeated is not None:
            _, groups = repeated
            rows = torch.tensor([members[0] for members in groups], dtype=torch.long, device=prompt_ids.device)
            prompt_ids, prompt_mask, position_ids = prompt_ids[rows], prompt_mask[rows], position_ids[rows]
        if observers.listening():  # the call rollout._prefill would make: model(the distinct rows, use_cache=True)
            inputs = {"input_ids": prompt_ids, "attention_mask": prompt_mask, "position_ids": position_ids}
            return self._reported(inputs, lambda: self._prefill_rows(prompt_ids, prompt_mask, position_ids, repeated))
        return self._prefill_rows(prompt_ids, prompt_mask, position_ids, repeated)

    def _prefill_rows(self, prompt_ids, prompt_mask, position_ids, repeated) -> torch.Tensor:
        inverse = repeated[0] if repeated is not None else None
        batch, length = prompt_ids.shape
        mask = None  # transformers' causal mask for sdpa: none (is_causal) without padding
        if not bool(prompt_mask.all()):
            causal = torch.ones((length, length), dtype=torch.bool, device=prompt_ids.device).tril()
            mask = causal[None, None] & prompt_mask.bool()[:, None, None, :]
        x = F.embedding(prompt_ids, self.embedding, self.padding_idx)
        cos, sin = self.rotary(x, position_ids)
        cos, sin = cos[:, None], sin[:, None]
        shape = (batch, length, -1, self.head_dim)
        for norm1, projections, o_proj, norm2, act, down, keys, values in self.layers:
            h = _rms_norm(norm1, x)
            q, k, v = self._qkv(h, projections, shape)
            q = (q * cos) + (_rotate_half(q) * sin)
            k = (k * cos) + (_rotate_half(k) * sin)
            if repeated is None:
                keys[:, :, :length], values[:, :, :length] = k, v
            else:
                keys[:, :, :length], values[:, :, :length] = k[inverse], v[inverse]
            if mask is None:
                out = F.scaled_dot_product_attention(q, k, v, scale=self.scaling, is_causal=True, enable_gqa=self.groups > 1)
            else:
                out = F.scaled_dot_product_attention(q, _repeat_kv(k, self.groups), _repeat_kv(v, self.groups), attn_mask=mask,
                                                     scale=self.scaling)
            x = x + F.linear(out.transpose(1, 2).reshape(batch, length, -1), *o_proj)
            x = x + self._mlp(_rms_norm(norm2, x), projections, act, down)
        logits = self._head(_rms_norm(self.norm, x)[:, -1])
        return logits if repeated is None else logits[inverse]

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        """The LM head, ``F.linear(x, *self.head)``, in row chunks of its weight on a CPU (see ``_head_chunks``)."""
        if self.head_chunks is None or torch.get_num_threads() != 1:
            return F.linear(x, *self.head)
        return torch.cat([F.linear(x, *chunk) for chunk in self.head_chunks], dim=-1)

    @staticmethod
    def _qkv(h, projections, shape):
        return (F.linear(h, *projections[i]).view(shape).transpose(1, 2) for i in range(3))

    @staticmethod
    def _mlp(h, projections, act, down):
        gate, up = F.linear(h, *projections[3]), F.linear(h, *projections[4])
        return F.linear(act(gate) * up, *down)

    def _attention(self, q, keys, values, mask, batch):
        """sdpa for one query token as transformers' integration calls it; (B, 1, heads × head_dim)."""
        if mask is None:
            out = F.scaled_dot_product_attention(q, keys, values, scale=self.scaling, enable_gqa=self.groups > 1)
        elif self.groups > 1:  # transformers' pack_gqa: the query heads of one key/value head side by side
            out = F.scaled_dot_product_attention(q.reshape(batch, -1, self.groups, self.head_dim), keys, values,
                                                 attn_mask=mask, scale=self.scaling)
        else:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling)
        return out.reshape(batch, -1, 1, self.head_dim).transpose(1, 2).reshape(batch, 1, -1)  # (undoes the grouping)

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (B,); the next-token logits (B, V)."""
        if observers.listening():  # the call rollout._sampling_loop would make: model(one token per row, the cache)
            s = self.step_index
            if self._full_mask is None:
                mask = self.prompt_mask
                self._full_mask = torch.cat([mask, mask.new_ones((mask.shape[0], self.positions.shape[1]))], dim=1)
            inputs = {"input_ids": token[:, None], "attention_mask": self._full_mask[:, : self.prompt_len + s + 1],
                      "position_ids": self.positions[:, s : s + 1], "past_key_values": self}
            return self._reported(inputs, lambda: self._step(token))
        return self._step(token)

    def _step(self, token: torch.Tensor) -> torch.Tensor:
        s, column = self.step_index, self.prompt_len + self.step_index
        self.step_index += 1
        cos, sin = self.cos[:, None, s : s + 1], self.sin[:, None, s : s + 1]
        mask = None if self.mask is None else self.mask[..., : column + 1]
        return self._layers(token, cos, sin, mask, column)

    def _layers(self, token: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None, column) -> torch.Tensor:
        """One decode step from the embedding to the logits (B, V): each layer stores the token's key and value at
        ``column`` (``_store``) and attends over ``_visible`` columns of its buffers under ``mask``."""
        batch = token.shape[0]
        x = F.embedding(token[:, None], self.embedding, self.padding_idx)
        shape = (batch, 1, -1, self.head_dim)
        for norm1, projections, o_proj, norm2, act, down, keys, values in self.layers:
            h = _rms_norm(norm1, x)
            q, k, v = self._qkv(h, projections, shape)
            q = (q * cos) + (_rotate_half(q) * sin)
            k = (k * cos) + (_rotate_half(k) * sin)
            self._store(keys, k, column)
            self._store(values, v, column)
            x = x + F.linear(self._attention(q, self._visible(keys, column), self._visible(values, column), mask, batch), *o_proj)
            x = x + self._mlp(_rms_norm(norm2, x), projections, act, down)
        x = _rms_norm(self.norm, x)
        return self._head(x[:, -1])

    @staticmethod
    def _store(buffer: torch.Tensor, new: torch.Tensor, column: int) -> None:
        """Write one token's keys or values (B, heads, 1, d) at ``column`` of a cache buffer (``narrow``: one view op
        where indexing makes three)."""
        buffer.narrow(2, column, 1).copy_(new)

    @staticmethod
    def _visible(buffer: torch.Tensor, column: int) -> torch.Tensor:
        """The filled part of a cache buffer: its columns up to and including ``column``."""
        return buffer.narrow(2, 0, column + 1)
