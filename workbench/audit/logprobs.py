"""Checks of a log-prob function ``logprob_fn(model, input_ids, attention_mask) -> Tensor[B, T-1]`` (S1, P6).

``logprob_fn`` returns log p(input_ids[:, t] | input_ids[:, :t]) for t = 1..T−1, the way a
trainer recomputes log-probs for its loss. The model and tokenizer come from the caller (any
Hugging Face causal LM); nothing here imports transformers.

* ``check_position_ids`` (S1): the same texts scored left-padded, right-padded and alone. With
  position ids derived from the mask (``cumsum(mask) − 1``, what ``generate`` uses) the three
  agree to float noise; with the model's default positions 0..T−1 a left-padded row's positions
  are shifted by its pad count. Only a model with *absolute* (learned) positions shows the
  shift — rotary positions are relative, so on Llama/Qwen the check cannot tell and does not pass.
* ``check_temperature`` (P6): on an unpadded batch, whether the log-probs are those of the
  sampling distribution softmax(logits / τ) or of softmax(logits) — with an estimate of the
  temperature the function actually applies.
"""

from __future__ import annotations

import math

import torch

from workbench.audit.result import AuditResult, by_position_plot
from workbench.audit.signatures import first_call, require_signature, require_tensor

EXPECTED = "logprob_fn(model, input_ids: Tensor[B, T], attention_mask: Tensor[B, T]) -> Tensor[B, T-1]"
TEXTS = ("12+34=46", "5*5=25", "1+2=3", "99-9=90")
POSITION_EMBEDDING_NAMES = ("wpe", "embed_positions", "position_embeddings", "pos_embed", "position_embedding")


def default_tolerance(model, *, shapes_differ: bool = False) -> float:
    """Float noise of a forward: 1e-4 nats in fp32, 3e-2 in half precision.

    ``shapes_differ``: the two log-probs compared come from batches of other shapes (a left-padded row
    against the same row alone). Every matmul and the attention's reduction then sum in another order,
    and a trainer's own attention path (a flash-attention stand-in, a packed forward) adds its own; the
    fp32 floor is then 1e-3 nats. Measured: OpenRLHF 0.11.2's correct, mask-derived positions differ by
    1.05e-4 nats on one machine and less on another; the position shift they guard against is 22 nats on
    the tiny GPT-2 and at least 0.1 on any model with learned absolute positions.
    """
    try:
        dtype = next(model.parameters()).dtype
    except (StopIteration, AttributeError, TypeError):
        dtype = torch.float32
    if dtype in (torch.float32, torch.float64):
        return 1e-3 if shapes_differ else 1e-4
    return 3e-2


def absolute_positions(model) -> tuple[bool, str]:
    """Whether ``model`` adds learned absolute position embeddings, and the evidence."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", "?")
    kind = getattr(config, "position_embedding_type", None)
    if kind == "absolute":
        return True, f"config.position_embedding_type = 'absolute' ({model_type})"
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in POSITION_EMBEDDING_NAMES and isinstance(module, torch.nn.Embedding):
            return True, f"learned position embedding {name} ({model_type})"
    if any("rotary" in name for name, _ in model.named_modules()) or getattr(config, "rope_theta", None) is not None \
            or getattr(config, "rope_parameters", None) is not None:
        return False, f"rotary (relative) positions ({model_type})"
    return False, f"no learned position embedding found ({model_type})"


def pad_id_of(tokenizer) -> int:
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return 0


def encode(tokenizer, texts=TEXTS) -> list[list[int]]:
    rows = [list(tokenizer(t)["input_ids"]) for t in texts]
    if any(len(r) < 3 for r in rows):
        raise ValueError("the audit texts encode to fewer than 3 tokens; pass longer texts=")
    return rows


def pad_rows(rows: list[list[int]], pad_id: int, side: str, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if side == "left" else slice(0, len(row))
        ids[i, span] = torch.tensor(row)
        mask[i, span] = 1
    return ids, mask


class _Scorer:
    def __init__(self, fn, check: str, model):
        self.fn, self.check, self.model, self.calls = fn, check, model, 0

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        device = _device_of(self.model)
        ids, mask = ids.to(device), mask.to(device)
        args = (self.model, ids, mask)
        out = first_call(self.fn, self.check, EXPECTED, *args) if self.calls == 0 else self.fn(*args)
        self.calls += 1
        if isinstance(out, tuple):  # (logprobs, entropy) and similar
            out = out[0]
        out = require_tensor(out, self.check, EXPECTED, shape=(ids.shape[0], ids.shape[1] - 1))
        return out.detach().float().cpu()


def _device_of(model):
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError, TypeError):
        return torch.device("cpu")


def check_position_ids(logprob_fn, model, tokenizer, *, texts=TEXTS, extra_pad: int = 4, tol: float | None = None) -> AuditResult:
    """S1: the same texts left-padded, right-padded and alone must give the same log-probs.

    ``details["max_abs_gap"]`` is the largest |Δ log p| over real targets; ``convention`` is
    ``"mask-derived"`` (positions follow the attention mask) or ``"model default"`` (0..T−1 whatever
    the padding). Passes only when the gap is float noise (``tol``, 1e-3 in fp32: see ``default_tolerance``) on a model with
    absolute positions; on a rotary model the result is "undetermined".
    """
    require_signature(logprob_fn, "check_position_ids", EXPECTED, 3)
    tol = default_tolerance(model, shapes_differ=True) if tol is None else tol
    score = _Scorer(logprob_fn, "check_position_ids", model)
    rows = encode(tokenizer, texts)
    pad = pad_id_of(tokenizer)
    width = max(len(r) for r in rows) + extra_pad
    left = score(*pad_rows(rows, pad, "left", width))
    right = score(*pad_rows(rows, pad, "right", width))
    gap_left, gap_right = [], []
    by_position = [0.0] * (max(len(r) for r in rows) - 1)
    for i, row in enumerate(rows):
        alone = score(torch.tensor([row]), torch.ones(1, len(row), dtype=torch.long))[0]
        n = len(row) - 1
        d_left = (left[i, width - len(row):] - alone).abs()
        d_right = (right[i, :n] - alone).abs()
        gap_left.append(float(d_left.max()))
        gap_right.append(float(d_right.max()))
        by_position = [max(a, float(b)) for a, b in zip(by_position, d_left.tolist() + [0.0] * len(by_position), strict=False)]
    absolute, evidence = absolute_positions(model)
    gap = max(gap_left + gap_right)
    if max(gap_right) > tol:
        convention = "padding-dependent (right padding changes the log-probs too)"
    elif not absolute:
        convention = "undetermined: " + evidence + " hide a position shift" if gap <= tol else "model default"
    else:
        convention = "mask-derived" if gap <= tol else "model default"
    passed = absolute and gap <= tol
    details = {
        "metric": "max |Δ log p| padded vs alone",
        "value": gap,
        "max_abs_gap": gap,
        "max_abs_gap_left": max(gap_left),
        "max_abs_gap_right": max(gap_right),
        "max_ratio_deviation": math.expm1(gap),
        "gap_by_row_left": gap_left,
        "absolute_positions": absolute,
        "position_evidence": evidence,
        "model_type": getattr(getattr(model, "config", None), "model_type", "?"),
        "tolerance": tol,
        "pads_added": [width - len(r) for r in rows],
        "plot": by_position_plot(by_position, "left-padded vs alone", "target position in the text", "max |Δ log p| (nats)",
                                 tol, f"{convention}"),
    }
    return AuditResult("position_ids", passed, convention, details)


def _token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[..., None]).squeeze(-1)


def check_temperature(logprob_fn, model, tokenizer, temperature: float, *, texts=TEXTS, tol: float | None = None) -> AuditResult:
    """P6: are ``logprob_fn``'s log-probs those of softmax(logits / temperature), the sampling distribution?

    ``details``: ``max_abs_gap`` to the sampling distribution at ``temperature``, ``max_abs_gap_at_1``
    to softmax(logits), ``effective_temperature`` (the τ whose log-probs the function matches best)
    and ``max_ratio_deviation`` = exp(gap) − 1, the first-step ratio error it causes.
    """
    require_signature(logprob_fn, "check_temperature", EXPECTED, 3)
    if not isinstance(temperature, (int, float)) or temperature <= 0 or temperature == 1:
        raise ValueError(f"temperature={temperature!r}: pass the sampling temperature of the trainer, > 0 and ≠ 1 "
                         "(at τ = 1 dividing by τ changes nothing, so the check cannot tell)")
    tol = default_tolerance(model) if tol is None else tol
    rows = encode(tokenizer, texts)
    length = min(len(r) for r in rows)
    ids = torch.tensor([r[:length] for r in rows])
    mask = torch.ones_like(ids)
    user = _Scorer(logprob_fn, "check_temperature", model)(ids, mask)
    device = _device_of(model)
    with torch.no_grad():
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits[:, :-1].float().cpu()
    targets = ids[:, 1:]

    def gap_at(tau: float) -> float:
        return float((user - _token_logprobs(logits / tau, targets)).abs().max())

    grid = sorted({round(math.exp(x / 20), 4) for x in range(-46, 47)} | {float(temperature), 1.0})
    gaps = [gap_at(t) for t in grid]
    best = min(range(len(grid)), key=gaps.__getitem__)
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    for _ in range(40):  # golden-section refinement of the effective temperature
        a, b = hi - (hi - lo) / 1.618, lo + (hi - lo) / 1.618
        lo, hi = (lo, b) if gap_at(a) < gap_at(b) else (a, hi)
    effective = (lo + hi) / 2
    gap_tau, gap_one = gap_at(temperature), gap_at(1.0)
    if gap_tau <= tol:
        convention = f"logits / τ (the sampling distribution at τ = {temperature:g})"
    elif gap_one <= tol:
        convention = "no temperature: scores softmax(logits) at τ = 1"
    else:
        convention = f"another distribution (best match τ ≈ {effective:.3g}, gap {gap_at(effective):.3g})"
    details = {
        "metric": f"max |Δ log p| vs softmax(logits / {temperature:g})",
        "value": gap_tau,
        "temperature": float(temperature),
        "max_abs_gap": gap_tau,
        "max_abs_gap_at_1": gap_one,
        "max_ratio_deviation": math.expm1(gap_tau),
        "effective_temperature": effective,
        "tolerance": tol,
        "plot": {
            "kind": "line",
            "x": grid,
            "series": {"max |Δ log p| vs softmax(logits / τ')": gaps},
            "xlabel": "τ' (temperature the reference divides by)",
            "ylabel": "max |Δ log p| (nats)",
            "threshold": tol,
            "log": True,
            "xlog": True,
            "title": f"sampling τ = {temperature:g}, function matches τ ≈ {effective:.3g}",
        },
    }
    return AuditResult("temperature", gap_tau <= tol, convention, details)
