"""Token log-probs and entropy in bounded memory: the (N, V) logits are only ever whole one chunk at a time.

At a real vocabulary the scorer's logits dominate memory: Qwen2.5's 151,936 entries × 16 rows ×
1,024 tokens are 10 GB once upcast to fp32, and a full ``log_softmax`` for the entropy doubles
that. TRL's ``selective_log_softmax`` loops over rows for the same reason; verl and Liger fuse the
LM head with the loss. Two levels here, both giving the numbers of the naive path (float noise,
≤ 1e-5 in fp32):

* ``logprobs_and_entropy(logits, labels)`` — the logits exist (model dtype), but their fp32 upcast,
  the softmax and the entropy are taken ``chunk`` rows at a time; the backward pass recomputes the
  softmax of each chunk instead of keeping fp32 copies for autograd.
* ``head_logprobs_and_entropy(hidden, weight, bias, labels)`` — from the last hidden state: the LM
  head is applied chunk by chunk, forward and backward, so not even the model-dtype (N, V) logits
  are ever whole. Only valid where the logits are exactly ``lm_head(hidden)`` (``lm_head_of``).

Order of operations, as everywhere in the workbench: upcast to fp32 *first*, then divide by the
temperature, then log-softmax. One chunk holds ``chunk_rows(V)`` rows (about 2^24 logits, 64 MB in
fp32). When everything fits in one chunk the softmax is kept for the backward pass (no
recomputation: small vocabularies lose nothing); otherwise it is recomputed chunk by chunk.
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 2**24
"""Logits per chunk (rows × vocabulary) when ``chunk_size`` is not given: 64 MB in fp32."""

# Architectures whose causal-LM logits are exactly ``lm_head(last_hidden_state)`` (transformers 5.x).
HEAD_ARCHITECTURES = ("gpt2", "llama", "qwen2", "qwen3", "mistral")
# Config fields that put a scale or a soft cap between the head and the logits (Gemma 2/3, Cohere,
# Granite, ...): any of them set means the full forward must be used.
LOGIT_TRANSFORM_FIELDS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_logits_scale",
                          "logit_softcapping")


def chunk_rows(vocab_size: int, chunk_size: int | None = None) -> int:
    """Rows per chunk: ``chunk_size`` when given, else as many as fit in ``CHUNK_ELEMENTS`` logits."""
    if chunk_size is not None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size={chunk_size} must be ≥ 1 (rows scored at once)")
        return chunk_size
    return max(1, CHUNK_ELEMENTS // max(vocab_size, 1))


def lm_head_of(model):
    """``(body, head)`` when ``model``'s logits are exactly ``head(body(...).last_hidden_state)``,
    else ``None`` (wrappers such as DDP, unknown architectures, logit scaling or soft-capping; a model sharded in
    place by FSDP2, whose body and head weights are gathered only by the model's own call)."""
    from transformers import PreTrainedModel  # transformers: seconds to import; loaded where a model is

    if not isinstance(model, PreTrainedModel) or any(cls.__name__ == "FSDPModule" for cls in type(model).__mro__):
        return None
    config = model.config
    if getattr(config, "model_type", None) not in HEAD_ARCHITECTURES:
        return None
    if any(getattr(config, field, None) not in (None, 1, 1.0) for field in LOGIT_TRANSFORM_FIELDS):
        return None
    head, body = model.get_output_embeddings(), model.base_model
    if type(head) is not torch.nn.Linear or body is model:
        return None
    return body, head


def _chunk_stats(logits: torch.Tensor, labels: torch.Tensor, temperature: float, with_entropy: bool, keep_probs: bool):
    """fp32 log-prob of ``labels`` (and entropy, and the softmax) of one chunk of model-dtype logits."""
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    lse = torch.logsumexp(x, dim=-1)
    logp = x.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse
    probs = entropy = None
    if with_entropy or keep_probs:
        log_probs = x - lse.unsqueeze(-1)
        probs = log_probs.exp()
        if with_entropy:
            entropy = -(probs * log_probs).sum(-1)
    return logp, entropy, (probs if keep_probs else None)


def _logits_grad(probs: torch.Tensor, labels: torch.Tensor, grad: torch.Tensor, temperature: float) -> torch.Tensor:
    """d logp / d logits · grad for one chunk, fp32: (onehot − softmax) · grad / τ."""
    out = probs.neg().mul_(grad.unsqueeze(-1))
    out.scatter_add_(-1, labels.unsqueeze(-1), grad.unsqueeze(-1))
    if temperature != 1.0:
        out = out / temperature
    return out


class _LogitsLogprobs(torch.autograd.Function):
    """Chunked log-probs (and entropy, not differentiable) of (N, V) model-dtype logits."""

    @staticmethod
    def forward(ctx, logits, labels, temperature, rows, with_entropy):
        n = logits.shape[0]
        keep = ctx.needs_input_grad[0] and 0 < n <= rows
        logp = torch.empty(n, dtype=torch.float32, device=logits.device)
        entropy = torch.empty(n if with_entropy else 0, dtype=torch.float32, device=logits.device)
        probs = None
        for start in range(0, n, rows):
            sl = slice(start, start + rows)
            logp[sl], chunk_entropy, probs = _chunk_stats(logits[sl], labels[sl], temperature, with_entropy, keep)
            if with_entropy:
                entropy[sl] = chunk_entropy
        ctx.temperature, ctx.rows, ctx.logits_dtype = temperature, rows, logits.dtype
        ctx.save_for_backward(labels, probs if keep else logits)
        ctx.kept_probs = keep
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        labels, saved = ctx.saved_tensors
        if ctx.kept_probs:
            return _logits_grad(saved, labels, grad_logp, ctx.temperature).to(ctx.logits_dtype), None, None, None, None
        grad = torch.empty_like(saved)
        for start in range(0, saved.shape[0], ctx.rows):
            sl = slice(start, start + ctx.rows)
            _, _, probs = _chunk_stats(saved[sl], labels[sl], ctx.temperature, False, True)
            grad[sl] = _logits_grad(probs, labels[sl], grad_logp[sl], ctx.temperature)
        return grad, None, None, None, None


class _HeadLogprobs(torch.autograd.Function):
    """Chunked ``lm_head`` + log-probs (+ entropy, not differentiable) from (N, H) hidden states."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, rows, with_entropy):
        n = hidden.shape[0]
        needs_grad = any(ctx.needs_input_grad[:3])
        keep = needs_grad and 0 < n <= rows
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(n if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        probs = None
        for start in range(0, n, rows):
            sl = slice(start, start + rows)
            logits = torch.nn.functional.linear(hidden[sl], weight, bias)
            logp[sl], chunk_entropy, probs = _chunk_stats(logits, labels[sl], temperature, with_entropy, keep)
            if with_entropy:
                entropy[sl] = chunk_entropy
        ctx.temperature, ctx.rows, ctx.has_bias = temperature, rows, bias is not None
        ctx.save_for_backward(hidden, weight, bias if bias is not None else hidden.new_empty(0), labels,
                              probs if keep else hidden.new_empty(0))
        ctx.kept_probs = keep
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, labels, kept = ctx.saved_tensors
        bias = bias if ctx.has_bias else None
        want_hidden, want_weight, want_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        # accumulate the parameter gradients over chunks in fp32, cast once at the end
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_weight else None
        grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if (want_bias and bias is not None) else None
        for start in range(0, hidden.shape[0], ctx.rows):
            sl = slice(start, start + ctx.rows)
            if ctx.kept_probs:
                probs = kept
            else:
                logits = torch.nn.functional.linear(hidden[sl], weight, bias)
                probs = _chunk_stats(logits, labels[sl], ctx.temperature, False, True)[2]
            grad_logits = _logits_grad(probs, labels[sl], grad_logp[sl], ctx.temperature).to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[sl] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight += (grad_logits.T @ hidden[sl]).float()
            if grad_bias is not None:
                grad_bias += grad_logits.float().sum(0)
        return (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype), None, None, None, None)


def logprobs_and_entropy(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, *,
                         with_entropy: bool = False, chunk_size: int | None = None):
    """log softmax(logits.float() / τ)[labels] (and the entropy) of logits (..., V), chunk by chunk.

    Returns ``(logprobs, entropy)`` shaped like ``labels`` (``entropy`` is None without
    ``with_entropy``; it carries no gradient). Negative labels are read as token 0."""
    shape, vocab = labels.shape, logits.shape[-1]
    flat_logits = logits.reshape(-1, vocab)
    flat_labels = labels.reshape(-1).clamp_min(0)
    rows = chunk_rows(vocab, chunk_size)
    logp, entropy = _LogitsLogprobs.apply(flat_logits, flat_labels, float(temperature), rows, with_entropy)
    return logp.view(shape), (entropy.view(shape) if with_entropy else None)


def head_logprobs_and_entropy(hidden: torch.Tensor, head: torch.nn.Linear, labels: torch.Tensor, temperature: float = 1.0, *,
                              with_entropy: bool = False, chunk_size: int | None = None):
    """The same from hidden states (..., H): ``head`` (the LM head) is applied one chunk at a time."""
    shape, vocab = labels.shape, head.weight.shape[0]
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_labels = labels.reshape(-1).clamp_min(0)
    logp, entropy = _HeadLogprobs.apply(flat_hidden, head.weight, head.bias, flat_labels, float(temperature),
                                        chunk_rows(vocab, chunk_size), with_entropy)
    return logp.view(shape), (entropy.view(shape) if with_entropy else None)


def entropy_chunked(logits: torch.Tensor, temperature: float = 1.0, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy (nats, fp32) of softmax(logits.float() / τ) at every position, chunk by chunk, no gradient."""
    vocab = logits.shape[-1]
    flat = logits.detach().reshape(-1, vocab)
    rows = chunk_rows(vocab, chunk_size)
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    dummy = torch.zeros(flat.shape[0], dtype=torch.long, device=logits.device)
    for start in range(0, flat.shape[0], rows):
        sl = slice(start, start + rows)
        out[sl] = _chunk_stats(flat[sl], dummy[sl], temperature, True, False)[1]
    return out.view(logits.shape[:-1])
