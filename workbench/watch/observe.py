"""Pure measurements on the tensors a watched call carries (torch only): padding, packing, stop ids, BOS, the
architecture's position encoding, dropout sites, a KV cache's identity and the weights' version counters (P29),
what an optimiser step left unchanged (P23), and (deep mode) the gradient's reach over paired rows (S4), which
sampling distribution a training gradient differentiates (P6, P14) and a rollout's re-scored log-probs (P12).
Each returns plain numbers; ``watcher.Watch`` turns them into findings, so the checks read as decisions.
"""

from __future__ import annotations

import math
import operator

import torch

from workbench.core.sampling_filters import filter_logits, kept_set

ABSOLUTE_POSITION_NAMES = ("wpe", "embed_positions", "position_embeddings")
ROTARY_CONFIG_FIELDS = ("rope_theta", "rope_scaling", "rope_parameters")


def position_encoding(model) -> str:
    """``absolute`` (a learned position table: GPT-2, OPT…), ``rotary`` (RoPE: Llama, Qwen2…) or ``unknown``."""
    rotary = False
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Embedding) and name.rsplit(".", 1)[-1] in ABSOLUTE_POSITION_NAMES:
            return "absolute"
        rotary = rotary or "Rotary" in type(module).__name__
    config = getattr(model, "config", None)
    rotary = rotary or any(getattr(config, field, None) is not None for field in ROTARY_CONFIG_FIELDS)
    return "rotary" if rotary else "unknown"


def first_set(*values):
    """The first value that is not None (None when all are): a setting's call argument, then its configs' values."""
    return next((value for value in values if value is not None), None)


def token_ids(value) -> list[int]:
    """Token ids as ints, from one id, a list or tuple of them, or a tensor; [] for None."""
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    return [int(token) for token in (value if isinstance(value, (list, tuple)) else [value]) if token is not None]


def special_tokens(model, tokenizer) -> tuple[set[int], int | None, int | None]:
    """(stop ids, BOS id, the pad id when it is also the EOS id) from the tokenizer and the model's configs: every EOS
    id any of them names stops a generation; the first one set wins for BOS, pad and EOS. The pad id is None when it
    differs from the EOS id (P8 cannot happen then)."""
    config = getattr(model, "config", None)
    generation = getattr(model, "generation_config", None)
    stop_ids = set(token_ids(getattr(tokenizer, "eos_token_id", None)) + token_ids(getattr(generation, "eos_token_id", None))
                   + token_ids(getattr(config, "eos_token_id", None)))
    bos_id = first_set(getattr(tokenizer, "bos_token_id", None), getattr(config, "bos_token_id", None))
    pad = first_set(getattr(tokenizer, "pad_token_id", None), getattr(generation, "pad_token_id", None),
                    getattr(config, "pad_token_id", None))
    eos = token_ids(first_set(getattr(tokenizer, "eos_token_id", None), getattr(config, "eos_token_id", None)))
    return stop_ids, bos_id, pad if pad is not None and pad in eos else None


def dropout_sites(model) -> list:
    """Modules whose forward drops activations in training mode: ``nn.Dropout`` and attention modules
    with a float ``attention_dropout`` (transformers' functional attention dropout)."""
    return [module for module in model.modules()
            if isinstance(module, torch.nn.Dropout) or isinstance(getattr(module, "attention_dropout", None), float)]


def dropout_in_effect(sites) -> tuple[int, float]:
    """(sites in training mode with p > 0, the largest such p)."""
    probabilities = [float(site.p if isinstance(site, torch.nn.Dropout) else site.attention_dropout) for site in sites if site.training]
    active = [probability for probability in probabilities if probability > 0]
    return len(active), max(active, default=0.0)


def cache_length(past) -> int:
    """Tokens already in a KV cache (0 for none or an empty one)."""
    if past is None:
        return 0
    length = getattr(past, "get_seq_length", None)
    if callable(length):
        try:
            return int(length())
        except (TypeError, ValueError, IndexError, AttributeError):
            return 0
    if isinstance(past, (tuple, list)) and past and isinstance(past[0], (tuple, list)) and past[0]:
        return int(past[0][0].shape[-2])
    return 0


def cache_anchor(past):
    """The object that stands for a KV cache's identity across calls: the cache itself (a transformers ``Cache``),
    or for a legacy tuple of (key, value) pairs its first key tensor (a tuple cannot be weakly referenced, and
    reusing the tuple means reusing that tensor). None for no cache or an empty legacy one."""
    if past is None:
        return None
    if isinstance(past, (tuple, list)):
        first = past[0] if past else None
        if isinstance(first, (tuple, list)) and first and isinstance(first[0], torch.Tensor):
            return first[0]
        return None
    return past


_VERSION = operator.attrgetter("_version")


def parameter_versions(parameters) -> tuple[int, ...]:
    """Each parameter's in-place version counter: an optimiser step, ``load_state_dict`` or any in-place write
    raises it, a forward does not. A cheap fingerprint of "the weights changed" (no tensor is read)."""
    return tuple(map(_VERSION, parameters))


def row_stats(input_ids: torch.Tensor | None, mask: torch.Tensor | None, bos: int | None, pad_id_if_eos: int | None) -> dict:
    """Per row of a 2-D batch: leading pads, trailing pads, two BOS at the start (P21), a masked EOS right
    after the last real token when pad = EOS (P8); and the pad counts of the left- and right-padded rows that hold
    a real token. One device→host copy."""
    if mask is None or mask.dim() != 2:
        if input_ids is None or input_ids.dim() != 2:
            return {}
        mask = torch.ones_like(input_ids)
    mask = mask.long()
    rows, width = mask.shape
    lead = (mask.cumsum(-1) == 0).sum(-1)
    trail = (mask.flip(-1).cumsum(-1) == 0).sum(-1)
    columns = [lead, trail]
    if input_ids is not None and input_ids.shape == mask.shape:
        if bos is not None and width > 1:
            first = input_ids.gather(1, lead.clamp(max=width - 1)[:, None])[:, 0]
            second = input_ids.gather(1, (lead + 1).clamp(max=width - 1)[:, None])[:, 0]
            columns.append(((first == bos) & (second == bos) & (lead + 1 < width)).long())
        else:
            columns.append(torch.zeros_like(lead))
        if pad_id_if_eos is not None:
            last = (width - trail - 1).clamp(min=0)
            after = (width - trail).clamp(max=width - 1)
            last_token = input_ids.gather(1, last[:, None])[:, 0]
            next_token = input_ids.gather(1, after[:, None])[:, 0]
            hidden = ((trail > 0) & (last_token != pad_id_if_eos) & (next_token == pad_id_if_eos)
                      & (mask.gather(1, after[:, None])[:, 0] == 0))
            columns.append(hidden.long())
        else:
            columns.append(torch.zeros_like(lead))
    else:
        columns += [torch.zeros_like(lead), torch.zeros_like(lead)]
    table = torch.stack(columns).tolist()
    lead, trail, double_bos, hidden_eos = table
    real = [width - leading - trailing for leading, trailing in zip(lead, trail, strict=True)]

    def padded(pads: list[int]) -> list[int]:  # the pad counts of the rows padded on that side that hold a real token
        return [count for count, tokens in zip(pads, real, strict=True) if 0 < count < width and tokens > 0]

    return {"double_bos": double_bos, "hidden_eos": hidden_eos,
            "left_padded": padded(lead), "right_padded": padded(trail)}


def row_layout(input_ids, mask, kwargs: dict) -> tuple[int, int, int]:
    """(rows, padded rows, packed rows) of a forward's batch. Padded: from a 2-D mask. Packed, rows holding more than
    one sequence: position ids that restart, or sequence boundaries passed as given (flash's packed path: one row)."""
    rows = int(input_ids.shape[0]) if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 else 0
    padded = int((mask == 0).any(-1).sum()) if isinstance(mask, torch.Tensor) and mask.dim() == 2 else 0
    positions = kwargs.get("position_ids")
    packed = 0
    if isinstance(positions, torch.Tensor) and positions.dim() == 2 and positions.shape[-1] > 1:
        packed = int((positions[:, 1:] < positions[:, :-1]).any(-1).sum())
    if not packed and kwargs.get("cu_seq_lens_q") is not None:
        packed = 1
    return rows, padded, packed


def parameter_dtype(model):
    """The dtype of the model's first parameter (None for a model without parameters)."""
    parameter = next(model.parameters(), None)
    return parameter.dtype if parameter is not None else None


def unchanged_fraction(snapshot) -> float:
    """The share of the elements of (parameter, its copy before an optimiser step) pairs that the step left as they were."""
    changed = total = 0
    for parameter, before_step in snapshot:
        moved = parameter.detach() != before_step
        changed += int(moved.sum())
        total += moved.numel()
    return 1.0 - changed / max(total, 1)


def rescoring_gap(logits: torch.Tensor, input_ids: torch.Tensor, rollout, temperature: float) -> dict:
    """|Δ log p| per response token between a rollout's sampled log-probs and ``logits``, the policy's forward on
    ``input_ids`` (the rollout's prompt and response, on the policy's device) at the sampling temperature."""
    device = input_ids.device
    prompt = rollout.prompt_ids.shape[1]
    logp = (logits[:, prompt - 1 : -1].float() / temperature).log_softmax(-1).gather(-1, input_ids[:, prompt:, None])[..., 0]
    keep = rollout.response_mask.to(device).bool()
    delta = (logp - rollout.rollout_logprobs.to(device).float()).abs()[keep]
    return {"mean_abs_delta_logp": float(delta.mean()) if delta.numel() else 0.0,
            "max_abs_delta_logp": float(delta.max()) if delta.numel() else 0.0, "tokens": int(delta.numel())}


def paired_prompt_gaps(input_ids: torch.Tensor, mask: torch.Tensor, moved: torch.Tensor) -> tuple[int, int] | None:
    """Rows i and i + B/2 that share a prefix (chosen and rejected of one prompt), with ``moved`` (B, T) the positions
    that receive gradient: (pairs with a prompt position that receives it in one row and not the other, such
    positions). None when the batch is not paired so (an odd count, or a pair sharing fewer than 2 tokens)."""
    rows = input_ids.shape[0]
    if rows < 2 or rows % 2:
        return None
    half = rows // 2
    same = (input_ids[:half] == input_ids[half:]) & mask[:half].bool() & mask[half:].bool()
    prefix = (same.long().cumprod(-1)).sum(-1)  # shared leading tokens of each pair
    if int(prefix.min()) < 2:
        return None
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
    in_prompt = positions < (prefix[:, None] - 1)  # logits at t predict token t + 1: still a prompt token
    differ = (moved[:half] != moved[half:]) & in_prompt
    return int(differ.any(-1).sum()), int(differ.sum())


# ---- deep mode: which distribution does the training gradient differentiate? ----------------------------
TEMPERATURE_GRID = [math.exp(math.log(0.2) + i * (math.log(5.0) - math.log(0.2)) / 96) for i in range(97)]


def _gradient_directions(logits: torch.Tensor, labels: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0):
    """onehot(label) − softmax(filter(z / τ)): the direction of ∂ log p(label) / ∂z under that distribution."""
    scores = filter_logits(logits / temperature, top_k=top_k, top_p=top_p)
    direction = -scores.softmax(-1)
    return direction.scatter_add(-1, labels[:, None], torch.ones_like(labels[:, None], dtype=direction.dtype))


def _cosines(observed: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
    """|cos| per row (the loss weight of a token may be negative: sign free)."""
    return (torch.nn.functional.cosine_similarity(observed, predicted, dim=-1)).abs()


def differentiated_distribution(hidden: torch.Tensor, hidden_grad: torch.Tensor, head_weight: torch.Tensor, labels: torch.Tensor,
                                sampling: dict) -> dict | None:
    """From positions whose last hidden state receives gradient: the temperature whose
    W^T(onehot − softmax(z/τ)) best matches the observed gradient, and the match of the full vs the
    sampler's filtered softmax. ``hidden``/``hidden_grad`` (N, H), ``labels`` (N,). None when no position fits."""
    keep = hidden_grad.float().norm(dim=-1) > 0
    if int(keep.sum()) == 0:
        return None
    hidden, hidden_grad, labels = hidden[keep].float(), hidden_grad[keep].float(), labels[keep]
    weight = head_weight.float()
    logits = hidden @ weight.T

    def median_cosine(temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
        """The median over positions of |cos(observed gradient, W^T direction)|: robust to the few positions whose
        gradient mixes two labels (a shared prompt's last token)."""
        return _cosines(hidden_grad, _gradient_directions(logits, labels, temperature, top_k, top_p) @ weight).median()

    fits = torch.stack([median_cosine(temperature) for temperature in TEMPERATURE_GRID])
    best = int(fits.argmax())
    tau = float(sampling.get("temperature") or 1.0)
    at_sampling = float(median_cosine(tau))
    out = {"positions": int(keep.sum()), "temperature_fit": TEMPERATURE_GRID[best], "fit": float(fits[best]),
           "fit_at_sampling_temperature": at_sampling}
    top_k, top_p = int(sampling.get("top_k") or 0), float(sampling.get("top_p") or 1.0)
    if top_k or top_p < 1.0:
        out["fit_filtered"] = float(median_cosine(tau, top_k, top_p))
        scores = logits / tau
        kept = kept_set(scores, top_k=top_k, top_p=top_p)
        out["kept_mass"] = float((scores.softmax(-1) * kept).sum(-1).mean())
    return out
