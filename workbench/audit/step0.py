"""``check_step0``: a user's RL step run before any update — the step-0 invariance panel (P6, P7, P12).

Before the first optimiser step the policy that sampled, the policy that is trained and the
reference are the same weights, so the importance ratio must be 1 on every token, nothing may
be clipped and the KL to the reference must be 0. When they are not, the trainer's π_old or
reference forward differs from its training forward: dropout left on (P7), log-probs from the
rollout engine at another precision or temperature (P12, P6), different padding (S1).

::

    step_fn(policy, reference, prompt_ids: Tensor[B, P], prompt_mask: Tensor[B, P]) -> dict with
        "old_logprobs": Tensor[B, R]   # π_old as your loss uses it (rollout or recomputed)
        "logprobs":     Tensor[B, R]   # π_θ from your training forward
        "mask":         Tensor[B, R]   # response tokens that enter the loss
        "ref_logprobs": Tensor[B, R]   # optional: the reference model's log-probs
        "rollout_logprobs": Tensor[B, R]  # optional: the sampler's own log-probs (reported, not judged)

``reference`` is a fresh deep copy of ``policy``; the prompts are left-padded. Run your rollout
and scoring code inside (with learning rate 0 if it also steps the optimiser). TRL, verl and
OpenRLHF names are accepted for the keys (``old_per_token_logps``/``old_log_probs``,
``per_token_logps``/``log_prob``/``action_log_probs``, ``ref_per_token_logps``/``ref_log_prob``/
``base_action_log_probs``, ``completion_mask``/``response_mask``/``action_mask``).

A model without dropout cannot show P7: then a pass says so ("P7 (dropout) not exercised …",
``details["p7"]``), as ``check_position_ids`` says "undetermined" on a rotary model. Switch dropout
on for the check with ``workbench.pitfalls.nb07_dropout.set_dropout(model, 0.1)`` (CLI: ``--dropout 0.1``).
"""

from __future__ import annotations

import copy
import math

import torch

from workbench.audit.logprobs import default_tolerance, encode, pad_id_of, pad_rows
from workbench.audit.result import AuditResult, by_position_plot
from workbench.audit.signatures import first_call, require_signature
from workbench.core.errors import AuditSignatureError

EXPECTED = ("step_fn(policy, reference, prompt_ids: Tensor[B, P], prompt_mask: Tensor[B, P]) -> "
            "dict(old_logprobs=Tensor[B, R], logprobs=Tensor[B, R], mask=Tensor[B, R], ref_logprobs=..., rollout_logprobs=...)")
PROMPTS = ("12+34=", "5*5=", "1+2=", "99-9=", "7+8=", "60-13=", "3*9=", "4+4=")
ALIASES = {
    "old_logprobs": ("old_logprobs", "old_per_token_logps", "old_log_probs", "old_log_prob"),
    "logprobs": ("logprobs", "per_token_logps", "log_probs", "log_prob", "action_log_probs"),
    "mask": ("mask", "completion_mask", "response_mask", "action_mask"),
    "ref_logprobs": ("ref_logprobs", "ref_per_token_logps", "ref_log_prob", "ref_log_probs", "base_action_log_probs"),
    "rollout_logprobs": ("rollout_logprobs", "rollout_log_probs", "sampling_per_token_logps"),
}


def _pick(out: dict, key: str, required: bool):
    for name in ALIASES[key]:
        if name in out and out[name] is not None:
            return out[name].detach().float().cpu()
    if required:
        raise AuditSignatureError(f"check_step0: the dict step_fn returned has no {key!r} (or {', '.join(ALIASES[key][1:])}); "
                                  f"got keys {sorted(out)}. Expected {EXPECTED}")
    return None


NOT_EXERCISED = ("P7 (dropout) not exercised: this model's config has no dropout > 0; rerun with --dropout 0.1 "
                 "(in Python: workbench.pitfalls.nb07_dropout.set_dropout(model, 0.1))")


def dropout_sites(model) -> int:
    """How many dropout modules or attention-dropout attributes of ``model`` have a probability > 0."""
    sites = 0
    for module in model.modules():
        sites += isinstance(module, torch.nn.Dropout) and module.p > 0
        sites += isinstance(getattr(module, "attention_dropout", None), float) and module.attention_dropout > 0
    return int(sites)


def _fingerprint(model) -> float:
    with torch.no_grad():
        return float(sum(p.double().abs().sum() for p in model.parameters()))


def check_step0(step_fn, model, tokenizer, *, prompts=PROMPTS, clip: float = 0.2, tol: float | None = None) -> AuditResult:
    """Ratio, clip fraction, KL to an identical reference and |Δ log p| by position at step 0 (module doc).

    Passes when max |ρ − 1| and max |log π − log π_ref| are float noise (``tol``, 1e-4 in fp32),
    nothing lies outside the clip range [1 − clip, 1 + clip], and the weights did not change.
    """
    require_signature(step_fn, "check_step0", EXPECTED, 4)
    tol = default_tolerance(model) if tol is None else tol
    rows = encode(tokenizer, prompts)
    ids, mask = pad_rows(rows, pad_id_of(tokenizer), "left", max(len(r) for r in rows))
    device = next(model.parameters()).device
    reference = copy.deepcopy(model)
    modes = {name: module.training for name, module in model.named_modules()}
    before = _fingerprint(model)
    try:
        out = first_call(step_fn, "check_step0", EXPECTED, model, reference, ids.to(device), mask.to(device))
    finally:
        for name, module in model.named_modules():
            module.training = modes.get(name, module.training)
    changed = abs(_fingerprint(model) - before) > 1e-9 * max(1.0, before)
    if not isinstance(out, dict):
        raise AuditSignatureError(f"check_step0: step_fn returned {type(out).__name__}; expected {EXPECTED}")
    old, new, m = _pick(out, "old_logprobs", True), _pick(out, "logprobs", True), _pick(out, "mask", True).bool()
    ref, rollout = _pick(out, "ref_logprobs", False), _pick(out, "rollout_logprobs", False)
    if old.shape != new.shape or m.shape != new.shape:
        raise AuditSignatureError(f"check_step0: old_logprobs {tuple(old.shape)}, logprobs {tuple(new.shape)} and mask "
                                  f"{tuple(m.shape)} must have one shape (B, R)")
    delta = (new - old).masked_fill(~m, 0.0)
    ratio = torch.exp(delta)
    tokens = int(m.sum())
    max_dev = float((ratio - 1).abs()[m].max()) if tokens else 0.0
    clip_fraction = float(((ratio - 1).abs() > clip)[m].float().mean()) if tokens else 0.0
    by_position = delta.abs().max(0).values.tolist()
    details = {
        "metric": "max |ρ − 1| at step 0",
        "value": max_dev,
        "max_ratio_deviation": max_dev,
        "mean_ratio": float(ratio[m].mean()) if tokens else 1.0,
        "clip_fraction": clip_fraction,
        "clip": clip,
        "response_tokens": tokens,
        "weights_changed": changed,
        "tolerance": tol,
    }
    ok_kl = True
    if ref is not None:
        log_ratio = (new - ref).masked_fill(~m, 0.0)
        k3 = (torch.expm1(-log_ratio) + log_ratio).masked_fill(~m, 0.0)
        details.update({
            "max_abs_ref_log_ratio": float(log_ratio.abs().max()),
            "kl_k1_per_sequence": float(log_ratio.sum(-1).mean()),
            "kl_k3_token_mean": float(k3.sum() / max(tokens, 1)),
        })
        ok_kl = details["max_abs_ref_log_ratio"] <= tol
    if rollout is not None:
        details["max_abs_rollout_vs_old"] = float((rollout - old).masked_fill(~m, 0.0).abs().max())
    passed = max_dev <= tol and clip_fraction == 0.0 and ok_kl and not changed
    if changed:
        convention = "the weights changed during the step: run it with learning rate 0"
    elif max_dev > tol:
        outside = f", {clip_fraction:.1%} of tokens outside the clip range" if clip_fraction else ""
        convention = f"π_old ≠ π_θ at step 0 (ratio ≠ 1{outside})"
    elif not ok_kl:
        convention = "KL to an identical reference ≠ 0 at step 0"
    else:
        convention = "on-policy at step 0 (ρ = 1" + (", KL = 0)" if ref is not None else "; no reference returned)")
    sites = dropout_sites(model)
    details["dropout_sites"] = sites
    if not sites:  # like position_ids' "undetermined" on a rotary model: a pass here says nothing about P7
        details["p7"] = NOT_EXERCISED
        if passed:
            convention += f"; {NOT_EXERCISED}"
    details["plot"] = by_position_plot(by_position, "max |log π_θ − log π_old|", "response position", "|Δ log p| (nats)", tol,
                                       f"max |ρ − 1| = {max_dev:.3g}, clip fraction {clip_fraction:.2f}")
    if not math.isfinite(max_dev):
        passed = False
    return AuditResult("step0", passed, convention, details)
