"""Rollout correction: importance weights and rejection masks for responses sampled by another policy.

The tokens a trainer learns from were sampled by a *rollout* policy — a bf16 inference engine, or
weights some updates old — whose log-probs differ from the training forward's. ``correct`` takes
both per-token log-probs and returns an importance weight per token (π_train / π_rollout, truncated
or masked), the response mask with outlier tokens or whole sequences rejected, and the diagnostics.
Its keywords, option strings and metric names are verl's (``compute_rollout_correction_and_rejection_mask``
in verl 0.9.1, metrics prefixed ``rollout_corr/``), so a verl config and its dashboards carry over:

* ``rollout_is``: ``None`` (no weights), ``"token"`` (ρ_t) or ``"sequence"`` (∏ρ_t, one weight per row);
  ``rollout_is_threshold``: ``2.0`` or ``"2.0"`` truncates the weights at 2 (TIS); ``"0.5_2.0"`` zeroes
  the weights outside [0.5, 2] (IcePop); ``rollout_is_batch_normalize`` rescales them to mean 1.
* ``rollout_rs``: comma-separated rejection criteria, every one must pass: ``token_k{1,2,3}``,
  ``seq_sum_k{1,2,3}``, ``seq_mean_k{1,2,3}``, ``seq_max_k{2,3}``, on the divergences k1 = −log ρ,
  k2 = ½ (log ρ)², k3 = ρ − 1 − log ρ; ``rollout_rs_threshold``: one bound shared or one per criterion,
  comma-separated; a k1 criterion takes ``"lower_upper"`` (on π_rollout/π_train, since k1 = −log ρ) or
  one upper bound u, meaning [1/u, u].

Log-ratios are clamped to ±20 before exponentiating (``SAFETY_BOUND``), as verl does, so ±inf
log-probs give finite weights. Computation runs in float32 at least (bf16 and fp16 inputs are upcast).
The metrics follow verl's definitions, including where an empty row counts: batch means over rows
(``*_seq_mean``, the perplexities, ``chi2_seq``, the sequence-level ``rollout_is_*``) include it as a
row with zero log-ratio sum and weight 0.

``mismatch_metrics`` gives the same diagnostics alone (verl's ``compute_rollout_corr_metrics_from_logprobs``).

TRL's ``GRPOTrainer`` corrects the same gap its own way (``vllm_importance_sampling_mode``):
``trl_mode("sequence_mask", clip_min=…, clip_max=…)`` is that setting and ``correct_trl`` applies it —
a NaN sampling log-prob gives ratio 1, no clamp before ``exp``, metrics under TRL's names. Its
``off_policy_mask_threshold`` (DeepSeek-V3.2's off-policy sequence mask) needs the advantages and the
current log-probs, so it is ``off_policy_mask``, applied in the loss.

``PRESETS`` names settings (verl's ``RolloutCorrectionConfig`` factories without bypass mode, and TRL's
four modes at their defaults) for trainers' ``rollout_correction=``; ``resolve`` and ``apply`` take a
preset name, a dict of ``correct``'s keywords, a dict of TRL ``GRPOConfig``'s keywords
(``vllm_importance_sampling_mode``, …: ``TRL_KEYWORDS``) or a ``TrlMode``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from workbench.core.errors import RolloutCorrectionError

SAFETY_BOUND = 20.0
"""|log ρ| is clamped to this before exp (exp(20) ≈ 4.9e8), in ``correct`` and the metrics."""
PREFIX = "rollout_corr/"
IS_LEVELS = ("token", "sequence")
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
TRL_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass(frozen=True)
class Correction:
    """What a correction gives: ``weights`` (B, T), 0 outside the response, or None when no importance
    weighting was asked; ``mask``: the response mask without the rejected tokens (same dtype as given);
    ``metrics``: scalar diagnostics by name."""

    weights: torch.Tensor | None
    mask: torch.Tensor
    metrics: dict[str, float]


@dataclass(frozen=True)
class TrlMode:
    """TRL ``GRPOTrainer``'s importance-sampling settings (``vllm_importance_sampling_mode``,
    ``vllm_importance_sampling_clip_min``/``_clip_max``, ``off_policy_mask_threshold``)."""

    mode: str = "sequence_mask"
    clip_min: float | None = None
    clip_max: float | None = 3.0
    off_policy_mask_threshold: float | None = None


# ---- inputs ---------------------------------------------------------------------------------------


def _check_tensors(names_and_tensors, response_mask: torch.Tensor) -> None:
    if not isinstance(response_mask, torch.Tensor) or response_mask.dim() != 2:
        shape = tuple(response_mask.shape) if isinstance(response_mask, torch.Tensor) else type(response_mask).__name__
        raise RolloutCorrectionError(f"response_mask must be a 2-D tensor (batch, response length), got {shape}",
                                     "response_mask")
    for name, tensor in names_and_tensors:
        if not isinstance(tensor, torch.Tensor):
            raise RolloutCorrectionError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}", name)
        if tensor.shape != response_mask.shape:
            raise RolloutCorrectionError(
                f"{name} has shape {tuple(tensor.shape)} but response_mask has {tuple(response_mask.shape)}: pass "
                "per-token log-probs of the response tokens, (batch, response length), aligned with the mask", name)
        if not tensor.is_floating_point():
            raise RolloutCorrectionError(f"{name} must hold floating-point log-probs, got {tensor.dtype}", name)
    values = response_mask.float()
    if not bool(((values == 0) | (values == 1)).all()):
        raise RolloutCorrectionError("response_mask must hold only 0 and 1 (or be boolean)", "response_mask")
    if not bool(response_mask.bool().any()):
        raise RolloutCorrectionError(
            "response_mask has no response token: there is nothing to correct; skip the batch instead", "response_mask")


def _work_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float32, or float64 when an input is float64: bf16/fp16 log-probs are upcast before any arithmetic."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _positive(value, what: str, parameter: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise RolloutCorrectionError(f"{parameter}: {what} {value!r} is not a number", parameter) from None
    if not number > 0:
        raise RolloutCorrectionError(f"{parameter}: {what} must be > 0, got {value!r}", parameter)
    return number


def parse_is_threshold(spec) -> tuple[float, float | None]:
    """``rollout_is_threshold`` → (upper, lower or None): a number or ``"upper"`` truncates (TIS),
    ``"lower_upper"`` masks outside [lower, upper] (IcePop)."""
    parameter = "rollout_is_threshold"
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise RolloutCorrectionError(
            f"{parameter} must be a number (e.g. 2.0: truncate at 2) or a string 'upper' or 'lower_upper' "
            f"(e.g. '0.5_2.0': zero the weights outside [0.5, 2]), got {spec!r}", parameter)
    if isinstance(spec, str) and "_" in spec.strip():
        lower_text, upper_text = spec.strip().split("_", 1)
        lower, upper = _positive(lower_text, "the lower bound", parameter), _positive(upper_text, "the upper bound", parameter)
        if lower > upper:
            raise RolloutCorrectionError(f"{parameter}: lower bound {lower} is above upper bound {upper} in {spec!r}",
                                         parameter)
        return upper, lower
    if isinstance(spec, str) and not spec.strip():
        raise RolloutCorrectionError(f"{parameter} is an empty string; give e.g. 2.0 or '0.5_2.0'", parameter)
    return _positive(spec, "the upper bound", parameter), None


def parse_rs(options, thresholds) -> list[tuple[str, float | None, float]]:
    """``rollout_rs`` and ``rollout_rs_threshold`` → [(option, lower or None, upper)], duplicates dropped, in
    order. A k1 option's bounds are ratios (lower defaults to 1/upper); the others' are divergence bounds."""
    if not isinstance(options, str) or not options.strip():
        raise RolloutCorrectionError(
            f"rollout_rs must be a non-empty string of comma-separated criteria from {RS_OPTIONS}, got {options!r}",
            "rollout_rs")
    names: list[str] = []
    for name in (part.strip() for part in options.split(",")):
        if not name:
            continue
        if name not in RS_OPTIONS:
            raise RolloutCorrectionError(f"rollout_rs: unknown criterion {name!r}; valid: {', '.join(RS_OPTIONS)}",
                                         "rollout_rs")
        if name not in names:
            names.append(name)
    if not names:
        raise RolloutCorrectionError(f"rollout_rs {options!r} names no criterion; valid: {', '.join(RS_OPTIONS)}",
                                     "rollout_rs")
    parameter = "rollout_rs_threshold"
    if thresholds is None:
        raise RolloutCorrectionError(
            f"{parameter} is required with rollout_rs={options!r}: one bound for every criterion, or one per "
            "criterion separated by commas (e.g. '0.5_2.0' for a k1 criterion, 0.01 for k2/k3)", parameter)
    if isinstance(thresholds, bool) or not isinstance(thresholds, (int, float, str)):
        raise RolloutCorrectionError(f"{parameter} must be a number or a string, got {thresholds!r}", parameter)
    specs = [str(thresholds)] if not isinstance(thresholds, str) else [p.strip() for p in thresholds.split(",") if p.strip()]
    if len(specs) == 1:
        specs = specs * len(names)
    if len(specs) != len(names):
        raise RolloutCorrectionError(
            f"{parameter} {thresholds!r} gives {len(specs)} bounds for {len(names)} criteria ({', '.join(names)}): "
            "give one shared bound or exactly one per criterion", parameter)
    parsed = []
    for name, spec in zip(names, specs, strict=True):
        if name.endswith("k1"):
            if "_" in spec:
                lower_text, upper_text = spec.split("_", 1)
                lower = _positive(lower_text, f"the lower bound for {name}", parameter)
                upper = _positive(upper_text, f"the upper bound for {name}", parameter)
            else:
                upper = _positive(spec, f"the bound for {name}", parameter)
                lower = 1.0 / upper
            if lower > upper:
                raise RolloutCorrectionError(f"{parameter}: for {name}, lower bound {lower} is above upper bound {upper}",
                                             parameter)
            parsed.append((name, lower, upper))
        else:
            if "_" in spec:
                raise RolloutCorrectionError(
                    f"{parameter}: {name} takes one upper bound on the divergence, not a range ({spec!r})", parameter)
            parsed.append((name, None, _positive(spec, f"the bound for {name}", parameter)))
    return parsed


# ---- masked reductions (verl's conventions: an empty row's sum and mean are 0) -----------------------


def _row_sum(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return torch.where(keep, values, torch.zeros((), dtype=values.dtype)).sum(-1)


def _row_mean(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return _row_sum(values, keep) / keep.sum(-1).to(values.dtype).clamp_min(1)


def _mean(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return torch.where(keep, values, torch.zeros((), dtype=values.dtype)).sum() / keep.sum().to(values.dtype).clamp_min(1)


def _masked_max(values: torch.Tensor, keep: torch.Tensor) -> float:
    return float(values.masked_fill(~keep, float("-inf")).max())


def _masked_min(values: torch.Tensor, keep: torch.Tensor) -> float:
    return float(values.masked_fill(~keep, float("inf")).min())


def _clamped_std(values: torch.Tensor, keep: torch.Tensor, low: float, high: float) -> float:
    """√(E[x²] − E[x]²) of ``values`` clamped to [low, high] over the kept tokens; 0 for a single token."""
    if int(keep.sum()) <= 1:
        return 0.0
    clamped = values.clamp(min=low, max=high)
    variance = _mean(clamped.square(), keep) - _mean(clamped, keep).square()
    return float(variance.clamp(min=0.0).sqrt())


def _std(values: torch.Tensor) -> float:
    return float(values.std()) if values.numel() > 1 else 0.0


# ---- importance weights -------------------------------------------------------------------------------


def _is_weights(log_ratio, keep, level, upper, lower, batch_normalize):
    """Truncated (lower None) or IcePop-masked weights and their metrics."""
    maskf = keep.to(log_ratio.dtype)
    if level == "token":
        ratio_log = log_ratio
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * maskf
    else:
        ratio_log = _row_sum(log_ratio, keep)[:, None]  # (B, 1): one log-weight per row, 0 for an empty row
        raw = torch.exp(ratio_log.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio) * maskf
    raw = torch.where(keep, raw, torch.zeros((), dtype=raw.dtype))
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros((), dtype=raw.dtype))
    metrics = _is_metrics(weights, raw, ratio_log, keep, level, upper, lower)
    if lower is not None:
        metrics["rollout_is_oob_ratio"] = float(_mean(((raw < lower) | (raw > upper)).to(raw.dtype), keep))
    if batch_normalize:
        if level == "token":
            mean = _mean(weights, keep)
        else:
            rows = keep.any(-1).to(weights.dtype)
            mean = (_row_mean(weights, keep) * rows).sum() / rows.sum().clamp_min(1e-8)
        if mean > 1e-8:
            weights = weights / mean
            metrics["rollout_is_batch_norm_factor"] = float(mean)
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    return weights.detach(), metrics


def _is_metrics(weights, raw, ratio_log, keep, level, upper, lower) -> dict[str, float]:
    """verl's ``rollout_is_*`` statistics: of the applied weights, except the high/low fractions, which are of
    the raw ratios (sequence level: of the log-weight of every row, an empty row included)."""
    low_bound = 1.0 / upper if lower is None else lower
    dtype = weights.dtype
    log_upper = torch.log(torch.tensor(upper, dtype=torch.float32)).to(dtype)
    log_lower = torch.log(torch.tensor(low_bound, dtype=torch.float32)).to(dtype)
    m: dict[str, float] = {}
    if level == "sequence":
        m["rollout_is_max"] = float(torch.exp(ratio_log.max().clamp(max=SAFETY_BOUND)))
        m["rollout_is_min"] = float(torch.exp(ratio_log.min()))
        m["rollout_is_mean"] = float(_mean(weights, keep))
        m["rollout_is_ratio_fraction_high"] = float((ratio_log > log_upper).to(dtype).mean())
        m["rollout_is_ratio_fraction_low"] = float((ratio_log < log_lower).to(dtype).mean())
    else:
        m["rollout_is_mean"] = float(_mean(weights, keep))
        m["rollout_is_ratio_fraction_high"] = float(_mean((raw > upper).to(dtype), keep))
        m["rollout_is_ratio_fraction_low"] = float(_mean((raw < low_bound).to(dtype), keep))
        m["rollout_is_max"] = _masked_max(weights, keep)
        m["rollout_is_min"] = _masked_min(weights, keep)
    m["rollout_is_std"] = _clamped_std(weights, keep, 0.0, upper)
    bounded = weights.clamp(min=0.0, max=upper)
    normalized = bounded / (_mean(bounded, keep) + 1e-8)
    m["rollout_is_eff_sample_size"] = 1.0 / float(_mean(normalized.square(), keep))
    per_row = _row_mean(weights, keep)
    m["rollout_is_seq_mean"] = float(per_row.mean())
    m["rollout_is_seq_std"] = _std(per_row)
    m["rollout_is_seq_max"] = float(per_row.max())
    m["rollout_is_seq_min"] = float(per_row.min())
    m["rollout_is_seq_max_deviation"] = float((per_row - 1.0).abs().max())
    raw_per_row = _row_mean(raw, keep)
    m["rollout_is_seq_fraction_high"] = float((raw_per_row > upper).to(dtype).mean())
    m["rollout_is_seq_fraction_low"] = float((raw_per_row < low_bound).to(dtype).mean())
    return m


# ---- rejection ----------------------------------------------------------------------------------------


def _divergences(log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {"k1": -safe, "k2": 0.5 * safe.square(), "k3": torch.exp(safe) - 1.0 - safe}


def _row_max(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Largest kept value of each row; 0 for an empty row."""
    best = values.masked_fill(~keep, float("-inf")).max(-1).values
    return torch.where(torch.isneginf(best), torch.zeros_like(best), best)


def _reject(log_ratio, keep, criteria):
    """(the mask's keep factor per token, metrics) for every rejection criterion (all must pass)."""
    divergences = _divergences(log_ratio)
    rows = keep.any(-1)
    combined = torch.ones_like(log_ratio)
    metrics: dict[str, float] = {}
    for name, lower, upper in criteria:
        kind = name[-2:]
        token_stat = divergences[kind]
        if lower is not None:  # k1: bounds on the ratio, compared in log space
            low, high = math.log(lower), math.log(upper)
        else:
            low, high = None, upper
        if name.startswith("token_"):
            stat, seq_stat = token_stat, None
        else:
            reduce = {"seq_sum": _row_sum, "seq_mean": _row_mean, "seq_max": _row_max}[name.rsplit("_", 1)[0]]
            seq_stat = reduce(token_stat, keep)
            stat = seq_stat[:, None].expand_as(log_ratio)
        passed = stat <= high if low is None else (stat >= low) & (stat <= high)
        combined = combined * passed.to(log_ratio.dtype)
        metrics.update(_rs_metrics(name, stat, seq_stat, keep, rows, low, high))
        rejected = ~passed & keep
        metrics[f"rollout_rs_{name}_masked_fraction"] = float(_mean(rejected.to(log_ratio.dtype), keep))
        metrics[f"rollout_rs_{name}_seq_masked_fraction"] = float(rejected.any(-1)[rows].to(log_ratio.dtype).mean())
    metrics["rollout_rs_masked_fraction"] = float(_mean(1 - combined, keep))
    # over every row, an empty one included (verl's convention for this one fraction)
    metrics["rollout_rs_seq_masked_fraction"] = float(((combined <= 0.5) & keep).any(-1).to(log_ratio.dtype).mean())
    return combined, metrics


def _rs_metrics(name, stat, seq_stat, keep, rows, low, high) -> dict[str, float]:
    """verl's ``rollout_rs_<criterion>_*`` statistics; ``low`` is None for the upper-bound-only criteria."""
    p = f"rollout_rs_{name}"
    dtype = stat.dtype
    per_row = seq_stat if seq_stat is not None else _row_mean(stat, keep)
    valid = per_row[rows]
    m: dict[str, float] = {f"{p}_mean": float(_mean(stat, keep))}
    if seq_stat is not None:
        m[f"{p}_max"], m[f"{p}_min"] = float(valid.max()), float(valid.min())
        m[f"{p}_fraction_high"] = float((valid > high).to(dtype).mean())
        m[f"{p}_fraction_low"] = float((valid < low).to(dtype).mean()) if low is not None else 0.0
    else:
        m[f"{p}_max"], m[f"{p}_min"] = _masked_max(stat, keep), _masked_min(stat, keep)
        m[f"{p}_fraction_high"] = float(_mean((stat > high).to(dtype), keep))
        m[f"{p}_fraction_low"] = float(_mean((stat < low).to(dtype), keep)) if low is not None else 0.0
    m[f"{p}_std"] = _clamped_std(stat, keep, 0.0 if low is None else low, high)
    m[f"{p}_seq_mean"] = float(valid.mean())
    m[f"{p}_seq_std"] = _std(valid)
    m[f"{p}_seq_max"] = float(valid.max())
    m[f"{p}_seq_min"] = float(valid.min())
    m[f"{p}_seq_max_deviation"] = float(valid.abs().max())
    m[f"{p}_seq_fraction_high"] = float((valid > high).to(dtype).mean())
    if low is not None:
        m[f"{p}_seq_fraction_low"] = float((valid < low).to(dtype).mean())
    return m


# ---- mismatch diagnostics -------------------------------------------------------------------------------


def _mismatch(log_prob, rollout_log_prob, keep) -> dict[str, float]:
    m: dict[str, float] = {}
    train_row = _row_mean(log_prob, keep)
    m["training_ppl"] = float(torch.exp(-train_row).mean())
    m["training_log_ppl"] = float((-train_row).mean())
    m["kl"] = float(_mean(rollout_log_prob - log_prob, keep))
    log_ratio = log_prob - rollout_log_prob
    m["k3_kl"] = float(_mean(torch.exp(log_ratio) - log_ratio - 1, keep))
    rollout_row = _row_mean(rollout_log_prob, keep)
    m["rollout_ppl"] = float(torch.exp(-rollout_row).mean())
    m["rollout_log_ppl"] = float((-rollout_row).mean())
    log_ppl_diff = rollout_row - train_row
    m["log_ppl_diff"] = float(log_ppl_diff.mean())
    m["log_ppl_abs_diff"] = float(log_ppl_diff.abs().mean())
    m["log_ppl_diff_max"] = float(log_ppl_diff.max())
    m["log_ppl_diff_min"] = float(log_ppl_diff.min())
    m["ppl_ratio"] = float(torch.exp(log_ppl_diff).mean())
    ratio = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    m["chi2_token"] = float(_mean(ratio.square(), keep) - 1.0)
    sequence_log_ratio = _row_sum(log_ratio, keep).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    m["chi2_seq"] = float(torch.exp(2.0 * sequence_log_ratio).mean() - 1.0)
    return m


def _prepared(old_log_prob, rollout_log_prob, response_mask, names=("old_log_prob", "rollout_log_prob")):
    _check_tensors(zip(names, (old_log_prob, rollout_log_prob), strict=True), response_mask)
    dtype = _work_dtype(old_log_prob, rollout_log_prob)
    keep = response_mask.bool()
    return old_log_prob.detach().to(dtype), rollout_log_prob.detach().to(dtype), keep


def _refuse_nan(names_and_tensors, keep) -> None:
    for name, tensor in names_and_tensors:
        bad = torch.isnan(tensor) & keep
        if bool(bad.any()):
            row, col = (int(i) for i in bad.nonzero()[0])
            raise RolloutCorrectionError(
                f"{name} is NaN at response token ({row}, {col}) (and {int(bad.sum()) - 1} more): no ratio can be formed "
                "there. Mask those tokens out of response_mask, or use correct_trl(trl_mode(...)), which treats a NaN "
                "sampling log-prob as ratio 1", name)


def mismatch_metrics(log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor) -> dict[str, float]:
    """The training–rollout gap on the response tokens, under verl's ``rollout_corr/`` names: ``kl`` (k1 of
    KL(π_rollout‖π)), ``k3_kl``, per-row perplexities averaged over rows (``training_ppl``, ``rollout_ppl``,
    their logs, ``log_ppl_diff`` and its abs/max/min, ``ppl_ratio``) and the χ² of the token and sequence ratios
    (``chi2_token``, ``chi2_seq``, ratios clamped at e^±20)."""
    log_prob, rollout_log_prob, keep = _prepared(log_prob, rollout_log_prob, response_mask, ("log_prob", "rollout_log_prob"))
    _refuse_nan((("log_prob", log_prob), ("rollout_log_prob", rollout_log_prob),
                 ("log_prob - rollout_log_prob", log_prob - rollout_log_prob)), keep)
    return {PREFIX + k: v for k, v in _mismatch(log_prob, rollout_log_prob, keep).items()}


def correct(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    rollout_is: str | None = None,
    rollout_is_threshold: float | str = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | str | None = None,
) -> Correction:
    """Importance weights (``rollout_is``), rejection (``rollout_rs``) and the mismatch metrics of one batch;
    ``old_log_prob``: the training forward's log-probs (π_old), ``rollout_log_prob``: the sampler's, both (B, T)
    on ``response_mask``. The options are verl's (module docstring). A NaN log-prob inside the response raises
    ``RolloutCorrectionError``; ±inf is clamped through ``SAFETY_BOUND``. Returns a ``Correction`` whose metric
    names carry the ``rollout_corr/`` prefix."""
    if rollout_is is not None and rollout_is not in IS_LEVELS:
        raise RolloutCorrectionError(f"rollout_is must be None, 'token' or 'sequence', got {rollout_is!r}", "rollout_is")
    if not isinstance(rollout_is_batch_normalize, bool):
        raise RolloutCorrectionError(f"rollout_is_batch_normalize must be True or False, got {rollout_is_batch_normalize!r}",
                                     "rollout_is_batch_normalize")
    if rollout_is is not None and rollout_is_threshold is None:
        raise RolloutCorrectionError(f"rollout_is={rollout_is!r} needs rollout_is_threshold (e.g. 2.0), got None",
                                     "rollout_is_threshold")
    upper, lower = parse_is_threshold(rollout_is_threshold) if rollout_is is not None else (None, None)
    criteria = parse_rs(rollout_rs, rollout_rs_threshold) if rollout_rs is not None else []
    old, rollout, keep = _prepared(old_log_prob, rollout_log_prob, response_mask)
    log_ratio = old - rollout
    _refuse_nan((("old_log_prob", old), ("rollout_log_prob", rollout), ("old_log_prob - rollout_log_prob", log_ratio)), keep)
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None:
        weights, is_metrics = _is_weights(log_ratio, keep, rollout_is, upper, lower, rollout_is_batch_normalize)
        metrics.update(is_metrics)
    mask = response_mask.clone()
    if criteria:
        passed, rs_metrics = _reject(log_ratio, keep, criteria)
        mask = (response_mask * passed.to(response_mask.dtype) if response_mask.dtype != torch.bool
                else response_mask & (passed > 0.5))
        metrics.update(rs_metrics)
    metrics.update(_mismatch(old, rollout, keep))
    return Correction(weights, mask, {PREFIX + k: v for k, v in metrics.items()})


# ---- TRL ------------------------------------------------------------------------------------------------


def trl_mode(mode: str = "sequence_mask", *, clip_min: float | None = None, clip_max: float | None = 3.0,
             off_policy_mask_threshold: float | None = None) -> TrlMode:
    """TRL ``GRPOTrainer``'s correction (its defaults: ``sequence_mask``, C_max 3, no C_min): ``*_truncate``
    clamps the ratio to [clip_min, clip_max], ``*_mask`` zeroes it outside; ``sequence_*`` uses ∏ρ_t per row.
    ``off_policy_mask_threshold`` δ drops, in the loss, sequences with A < 0 whose mean
    log π_rollout − log π exceeds δ (``off_policy_mask``)."""
    if mode not in TRL_MODES:
        raise RolloutCorrectionError(f"trl_mode: mode must be one of {TRL_MODES}, got {mode!r}", "mode")
    for name, value in (("clip_min", clip_min), ("clip_max", clip_max), ("off_policy_mask_threshold", off_policy_mask_threshold)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value)):
            raise RolloutCorrectionError(f"trl_mode: {name} must be a number or None, got {value!r}", name)
    if mode.endswith("truncate") and clip_min is None and clip_max is None:
        raise RolloutCorrectionError(f"trl_mode: {mode} needs clip_min or clip_max (or both)", "clip_max")
    if clip_min is not None and clip_max is not None and clip_min > clip_max:
        raise RolloutCorrectionError(f"trl_mode: clip_min {clip_min} is above clip_max {clip_max}", "clip_min")
    return TrlMode(mode, None if clip_min is None else float(clip_min), None if clip_max is None else float(clip_max),
                   None if off_policy_mask_threshold is None else float(off_policy_mask_threshold))


def correct_trl(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
                mode: TrlMode) -> Correction:
    """TRL 1.16's importance ratio for one batch (``mode`` from ``trl_mode``): log-ratio differences on the
    response, a NaN one (a token the sampler could not score) set to 0 (ratio 1), ``exp`` without a clamp, then
    truncated or masked. ``weights`` (B, T), 0 outside the response; the mask is returned unchanged. Metrics under
    TRL's names: ``sampling/importance_sampling_ratio/{min,mean,max}`` (of the sequence ratios, or of the
    response tokens' ratios) and ``sampling/sampling_logp_difference/{mean,max}`` (|Δ log p| over the response
    tokens whose difference is not NaN)."""
    if not isinstance(mode, TrlMode):
        raise RolloutCorrectionError(f"mode must be a TrlMode (from trl_mode(...)), got {type(mode).__name__}", "mode")
    old, rollout, keep = _prepared(old_log_prob, rollout_log_prob, response_mask)
    difference = torch.nan_to_num(torch.where(keep, old - rollout, torch.zeros((), dtype=old.dtype)), nan=0.0)
    sequence_level = mode.mode.startswith("sequence")
    log_ratio = difference.sum(-1, keepdim=True) if sequence_level else difference
    ratio = torch.exp(log_ratio)
    if mode.mode.endswith("truncate"):
        ratio = torch.clamp(ratio, min=mode.clip_min, max=mode.clip_max)
    else:
        low = -math.inf if mode.clip_min is None else mode.clip_min
        high = math.inf if mode.clip_max is None else mode.clip_max
        ratio = ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    weights = torch.where(keep, ratio.expand_as(old), torch.zeros((), dtype=old.dtype))
    flat = ratio.flatten() if sequence_level else ratio[keep]
    delta = (old - rollout).abs()
    delta = delta[keep & ~torch.isnan(delta)]
    metrics = {
        "sampling/sampling_logp_difference/mean": float(delta.mean()) if delta.numel() else 0.0,
        "sampling/sampling_logp_difference/max": float(delta.max()) if delta.numel() else 0.0,
        "sampling/importance_sampling_ratio/min": float(flat.min()) if flat.numel() else 0.0,
        "sampling/importance_sampling_ratio/mean": float(flat.mean()) if flat.numel() else 0.0,
        "sampling/importance_sampling_ratio/max": float(flat.max()) if flat.numel() else 0.0,
    }
    return Correction(weights.detach(), response_mask.clone(), metrics)


def off_policy_mask(advantages: torch.Tensor, log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                    response_mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """TRL's off-policy sequence mask (DeepSeek-V3.2, Eq. 9), (B, 1) of 1.0 keep / 0.0 drop: a row is kept when its
    advantage is ≥ 0 or its mean log π_rollout − log π over the response (a NaN difference counted as 0) is ≤
    ``threshold``. ``log_prob``: the current policy's (detached here); ``advantages``: (B,) or (B, 1)."""
    _check_tensors((("log_prob", log_prob), ("rollout_log_prob", rollout_log_prob)), response_mask)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or math.isnan(threshold):
        raise RolloutCorrectionError(f"threshold must be a number, got {threshold!r}", "threshold")
    advantages = advantages.reshape(-1, 1)
    if advantages.shape[0] != response_mask.shape[0]:
        raise RolloutCorrectionError(f"advantages has {advantages.shape[0]} rows, response_mask {response_mask.shape[0]}",
                                     "advantages")
    dtype = _work_dtype(log_prob, rollout_log_prob)
    keep = response_mask.bool()
    divergence = torch.nan_to_num(rollout_log_prob.to(dtype) - log_prob.detach().to(dtype), nan=0.0)
    divergence = torch.where(keep, divergence, torch.zeros((), dtype=dtype))
    mean = divergence.sum(1, keepdim=True) / keep.sum(1, keepdim=True).to(dtype).clamp(min=1.0)
    return ((advantages >= 0) | (mean <= threshold)).to(dtype)


# ---- presets ------------------------------------------------------------------------------------------

PRESETS: dict[str, dict | TrlMode] = {
    # verl's RolloutCorrectionConfig factories at their default thresholds (bypass mode is a trainer's matter)
    "decoupled_token_is": {"rollout_is": "token", "rollout_is_threshold": 2.0},
    "decoupled_seq_is": {"rollout_is": "sequence", "rollout_is_threshold": 2.0},
    "decoupled_token_icepop": {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
    "decoupled_seq_is_rs": {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "seq_sum_k1",
                            "rollout_rs_threshold": "0.5_2.0"},
    "decoupled_geo_rs": {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.999_1.001"},
    "k3_rs": {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.01},
    # TRL GRPOTrainer's four modes at its defaults (clip_max 3, no clip_min)
    **{f"trl_{mode}": TrlMode(mode) for mode in TRL_MODES},
}
CORRECT_KEYWORDS = ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs", "rollout_rs_threshold")
TRL_KEYWORDS = {"vllm_importance_sampling_mode": "mode", "vllm_importance_sampling_clip_min": "clip_min",
                "vllm_importance_sampling_clip_max": "clip_max", "off_policy_mask_threshold": "off_policy_mask_threshold"}
"""TRL ``GRPOConfig``'s names → ``trl_mode``'s: a dict with these keys is a TRL setting (missing ones take TRL's defaults)."""


def resolve(spec, parameter: str = "rollout_correction") -> dict | TrlMode | None:
    """A preset name, a dict of ``correct``'s keywords, a ``TrlMode`` or None → the dict or ``TrlMode`` (None
    stays None), checked: bad names, keywords and thresholds raise ``RolloutCorrectionError`` here, not mid-run."""
    if spec is None or isinstance(spec, TrlMode):
        return spec
    if isinstance(spec, str):
        if spec not in PRESETS:
            raise RolloutCorrectionError(f"{parameter}: unknown preset {spec!r}; presets: {', '.join(PRESETS)}", parameter)
        return PRESETS[spec]
    if isinstance(spec, dict) and spec and set(spec) <= set(TRL_KEYWORDS):
        return trl_mode(**{TRL_KEYWORDS[k]: v for k, v in spec.items()})
    if isinstance(spec, dict):
        unknown = sorted(set(spec) - set(CORRECT_KEYWORDS))
        if unknown:
            raise RolloutCorrectionError(f"{parameter}: unknown keyword(s) {unknown}; valid: {', '.join(CORRECT_KEYWORDS)}",
                                         parameter)
        probe = torch.zeros(1, 1)
        correct(probe, probe, torch.ones(1, 1), **spec)  # the options' own checks, on a one-token batch
        return dict(spec)
    raise RolloutCorrectionError(
        f"{parameter} must be None, a preset name, a dict of correct()'s keywords or trl_mode(...), got {spec!r}", parameter)


def apply(spec: dict | TrlMode, old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
          response_mask: torch.Tensor) -> Correction:
    """``correct`` with a resolved dict of keywords, or ``correct_trl`` with a ``TrlMode``."""
    if isinstance(spec, TrlMode):
        return correct_trl(old_log_prob, rollout_log_prob, response_mask, spec)
    return correct(old_log_prob, rollout_log_prob, response_mask, **spec)
