"""Pure measurements on the tensors a watched call carries (torch only): padding, stop ids, BOS, the
architecture's position encoding, dropout sites, a KV cache's identity and the weights' version counters (P29),
and (deep mode) which sampling distribution a training gradient differentiates. Each returns plain numbers;
``watch.Watch`` turns them into findings.
"""

from __future__ import annotations

import math
import operator

import torch

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
    rotary = rotary or any(getattr(config, f, None) is not None for f in ROTARY_CONFIG_FIELDS)
    return "rotary" if rotary else "unknown"


def dropout_sites(model) -> list:
    """Modules whose forward drops activations in training mode: ``nn.Dropout`` and attention modules
    with a float ``attention_dropout`` (transformers' functional attention dropout)."""
    return [m for m in model.modules()
            if isinstance(m, torch.nn.Dropout) or isinstance(getattr(m, "attention_dropout", None), float)]


def dropout_in_effect(sites) -> tuple[int, float]:
    """(sites in training mode with p > 0, the largest such p)."""
    probabilities = [float(m.p if isinstance(m, torch.nn.Dropout) else m.attention_dropout) for m in sites if m.training]
    active = [p for p in probabilities if p > 0]
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


def parameter_versions(parameters) -> tuple[int, ...]:
    """Each parameter's in-place version counter: an optimiser step, ``load_state_dict`` or any in-place write
    raises it, a forward does not. A cheap fingerprint of "the weights changed" (no tensor is read)."""
    return tuple(map(_VERSION, parameters))


_VERSION = operator.attrgetter("_version")


def row_stats(input_ids: torch.Tensor | None, mask: torch.Tensor | None, bos: int | None, pad_is_eos: int | None) -> dict:
    """Per row of a 2-D batch: leading pads, trailing pads, two BOS at the start (P21), a masked EOS right
    after the last real token when pad = EOS (P8). One device→host copy."""
    if mask is None or mask.dim() != 2:
        if input_ids is None or input_ids.dim() != 2:
            return {}
        mask = torch.ones_like(input_ids)
    m = mask.long()
    rows, width = m.shape
    lead = (m.cumsum(-1) == 0).sum(-1)
    trail = (m.flip(-1).cumsum(-1) == 0).sum(-1)
    columns = [lead, trail]
    if input_ids is not None and input_ids.shape == m.shape:
        ids = input_ids
        if bos is not None and width > 1:
            first = ids.gather(1, lead.clamp(max=width - 1)[:, None])[:, 0]
            second = ids.gather(1, (lead + 1).clamp(max=width - 1)[:, None])[:, 0]
            columns.append(((first == bos) & (second == bos) & (lead + 1 < width)).long())
        else:
            columns.append(torch.zeros_like(lead))
        if pad_is_eos is not None:
            last = (width - trail - 1).clamp(min=0)
            after = (width - trail).clamp(max=width - 1)
            last_tok = ids.gather(1, last[:, None])[:, 0]
            next_tok = ids.gather(1, after[:, None])[:, 0]
            hidden = (trail > 0) & (last_tok != pad_is_eos) & (next_tok == pad_is_eos) & (m.gather(1, after[:, None])[:, 0] == 0)
            columns.append(hidden.long())
        else:
            columns.append(torch.zeros_like(lead))
    else:
        columns += [torch.zeros_like(lead), torch.zeros_like(lead)]
    table = torch.stack(columns).tolist()
    lead, trail, double_bos, hidden_eos = table
    real = [width - a - b for a, b in zip(lead, trail, strict=True)]
    return {"lead": lead, "trail": trail, "double_bos": double_bos, "hidden_eos": hidden_eos, "real": real, "width": width}


# ---- deep mode: which distribution does the training gradient differentiate? ----------------------------
TEMPERATURE_GRID = [math.exp(math.log(0.2) + i * (math.log(5.0) - math.log(0.2)) / 96) for i in range(97)]


def _filtered(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k then top-p (nucleus) truncation of scores, as the sampler does (reimplemented here so this
    package stays torch-only)."""
    if top_k and top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = scores.sort(dim=-1, descending=True)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = (cumulative - ordered.softmax(-1)) >= top_p
        scores = scores.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
    return scores


def _gradient_directions(logits: torch.Tensor, labels: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0):
    """onehot(label) − softmax(filter(z / τ)): the direction of ∂ log p(label) / ∂z under that distribution."""
    scores = _filtered(logits / temperature, top_k, top_p)
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
    h, g, y = hidden[keep].float(), hidden_grad[keep].float(), labels[keep]
    weight = head_weight.float()
    logits = h @ weight.T
    project = lambda d: d @ weight  # noqa: E731 (W^T d, row-wise)
    # the median over positions: robust to the few whose gradient mixes two labels (a shared prompt's last token)
    fits = torch.stack([_cosines(g, project(_gradient_directions(logits, y, t))).median() for t in TEMPERATURE_GRID])
    best = int(fits.argmax())
    tau = float(sampling.get("temperature") or 1.0)
    at_sampling = float(_cosines(g, project(_gradient_directions(logits, y, tau))).median())
    out = {"positions": int(keep.sum()), "temperature_fit": TEMPERATURE_GRID[best], "fit": float(fits[best]),
           "fit_at_sampling_temperature": at_sampling}
    top_k, top_p = int(sampling.get("top_k") or 0), float(sampling.get("top_p") or 1.0)
    if top_k or top_p < 1.0:
        out["fit_filtered"] = float(_cosines(g, project(_gradient_directions(logits, y, tau, top_k, top_p))).median())
        kept = _filtered(logits / tau, top_k, top_p).isfinite()
        out["kept_mass"] = float(((logits / tau).softmax(-1) * kept).sum(-1).mean())
    return out
