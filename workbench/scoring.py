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
):
    """Per-token log-probs (B, R) of ``response_ids`` given left-padded ``prompt_ids``.

    Returns ``logprobs`` or ``(logprobs, entropy)``. Values at masked response positions are
    computed but meaningless: every consumer multiplies by ``response_mask``.
    """
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    logits = forward(model, input_ids, attention_mask, position_ids=position_ids, temperature=temperature).logits
    prompt_width = prompt_ids.shape[1]
    response_logits = logits[:, prompt_width - 1 : -1]
    logprobs = logprobs_of(response_logits, response_ids)
    if with_entropy:
        return logprobs, entropy_from_logits(response_logits)
    return logprobs


def sequence_token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, position_ids: str = "mask"):
    """log p(token t | tokens < t) for t = 1..T-1 of every row: shape (B, T-1)."""
    logits = forward(model, input_ids, attention_mask, position_ids=position_ids).logits
    return logprobs_of(logits[:, :-1], input_ids[:, 1:])
