"""The training-time forward pass and token log-probabilities.

``forward`` is the one visible place where a training or scoring forward builds its inputs (the
lm-human-preference-details pattern). Its ``position_ids`` switch is pitfall S1:

* ``"mask"`` (fix): positions derived from the attention mask, exactly what ``generate`` does;
* ``"model"`` (bug): only ``input_ids`` and ``attention_mask`` are passed, so the model numbers
  positions 0..T-1 and a left-padded row's positions are shifted by its pad count.

``temperature`` divides the logits before the log-softmax; sampling at τ and scoring at 1 is
pitfall P6.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workbench.batching import position_ids_from_mask

POSITION_IDS_MODES = ("mask", "model")


def forward(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    position_ids: str = "mask",
    temperature: float = 1.0,
    output_hidden_states: bool = False,
):
    """Run ``model`` on a padded batch without a cache; returns the model output with
    ``logits`` divided by ``temperature``."""
    if position_ids not in POSITION_IDS_MODES:
        raise ValueError(f"position_ids={position_ids!r}; use 'mask' (fix) or 'model' (the S1 bug)")
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    if position_ids == "mask":
        inputs["position_ids"] = position_ids_from_mask(attention_mask)
    output = model(**inputs, output_hidden_states=output_hidden_states)
    if temperature != 1.0:
        output.logits = output.logits / temperature
    return output


def logprobs_of(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] without materialising the full log-softmax."""
    logits = logits.float()
    picked = logits.gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of the softmax distribution at every position."""
    logits = logits.float()
    log_probs = F.log_softmax(logits, dim=-1)
    return -(log_probs.exp() * log_probs).sum(-1)


def contiguous_rows(attention_mask: torch.Tensor) -> bool:
    """True when every row's real tokens form one block (left, right or both-sides padding)."""
    mask = attention_mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    first = torch.where(mask, positions, mask.shape[1]).min(-1).values
    last = torch.where(mask, positions, -1).max(-1).values
    count = mask.sum(-1)
    return bool(((count == 0) | (last - first + 1 == count)).all())


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    position_ids: str = "mask",
    temperature: float = 1.0,
    packed: bool = False,
    with_entropy: bool = False,
):
    """log p(token t | tokens < t) for t = 1..T−1 of every row: shape (B, T−1) (and the entropy).

    ``packed=True`` scores the same rows padding-free: the real tokens of every row are packed
    into one sequence (``workbench.batching.pack_sequences``: restarting position ids, no mask,
    no cache) and the results are scattered back to the padded layout, so callers cannot tell the
    difference except in speed. Values at padded targets are 0 with packing and meaningless
    without: consumers always multiply by a mask.
    """
    if packed:
        return _packed_token_logprobs(model, input_ids, attention_mask, temperature=temperature, with_entropy=with_entropy)
    logits = forward(model, input_ids, attention_mask, position_ids=position_ids, temperature=temperature).logits[:, :-1]
    logprobs = logprobs_of(logits, input_ids[:, 1:])
    if not with_entropy:
        return logprobs
    with torch.no_grad():  # a metric: no autograd graph for it
        return logprobs, entropy_from_logits(logits.detach())


def _packed_token_logprobs(model, input_ids, attention_mask, *, temperature: float, with_entropy: bool):
    from workbench.batching import pack_sequences

    if not contiguous_rows(attention_mask):
        raise ValueError("packed scoring needs each row's real tokens in one contiguous block")
    mask = attention_mask.bool()
    packed = pack_sequences([row[m] for row, m in zip(input_ids, mask)])
    logits = model(**packed.model_inputs()).logits[0]
    if temperature != 1.0:
        logits = logits / temperature
    has_target = packed.targets[0] != -100
    # Targets of each row, in order: every real token but the row's first one.
    target_cols = mask[:, 1:] & mask[:, :-1]
    logprobs = torch.zeros(input_ids.shape[0], input_ids.shape[1] - 1, dtype=torch.float32, device=input_ids.device)
    logprobs = logprobs.masked_scatter(target_cols, logprobs_of(logits[has_target], packed.targets[0][has_target]))
    if not with_entropy:
        return logprobs
    with torch.no_grad():
        entropy = torch.zeros_like(logprobs).masked_scatter(target_cols, entropy_from_logits(logits[has_target].detach()))
    return logprobs, entropy


def response_logprobs(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    position_ids: str = "mask",
    temperature: float = 1.0,
    with_entropy: bool = False,
    packed: bool = False,
):
    """Per-token log-probs (B, R) of ``response_ids`` given left-padded ``prompt_ids``.

    Returns ``logprobs`` or ``(logprobs, entropy)``. Values at masked response positions are
    meaningless: every consumer multiplies by ``response_mask``.
    """
    result = token_logprobs(
        model, torch.cat([prompt_ids, response_ids], dim=1), torch.cat([prompt_mask, response_mask], dim=1),
        position_ids=position_ids, temperature=temperature, packed=packed, with_entropy=with_entropy,
    )
    prompt_width = prompt_ids.shape[1]
    if with_entropy:
        return result[0][:, prompt_width - 1 :], result[1][:, prompt_width - 1 :]
    return result[:, prompt_width - 1 :]


def sequence_token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, position_ids: str = "mask", packed: bool = False):
    """log p(token t | tokens < t) for t = 1..T−1 of every row: shape (B, T−1)."""
    return token_logprobs(model, input_ids, attention_mask, position_ids=position_ids, packed=packed)
