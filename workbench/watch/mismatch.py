"""P12 from the rollout-correction diagnostics: how far the sampler's log-probs are from the trainer's.

Where the watch sees both — deep mode re-scores a rollout drawn by another model than the policy (a low-precision
copy, a copy holding older weights, an inference engine) with the policy's own forward — it computes verl's
``rollout_corr/`` diagnostics on the response tokens with ``core.rollout_correction`` (the mismatch metrics of
``mismatch_metrics`` and, through ``correct`` with verl's default token-level weights truncated at 2, the weights'
mean, spread and effective-sample-size share) and decides a severity:

* **error** — a threshold of verl's health check is crossed: ``chi2_token`` > 1, ``rollout_is_eff_sample_size``
  < 0.3, ``|kl|`` > 0.1, ``rollout_is_mean`` outside [0.5, 2] or ``rollout_is_std`` > 1. Source:
  verl's rollout-correction guide, ``docs/algo/rollout_corr.md`` (``check_rollout_correction_health`` and its
  "Troubleshooting" section; https://github.com/volcengine/verl/blob/main/docs/algo/rollout_corr.md). There the
  gap is large enough that uncorrected ratios, or a sequence-level correction, swing the gradient.
* **warning** — none crossed, but the largest |log π_train − log π_rollout| over the response tokens exceeds
  ``NOISE_LOG_RATIO`` (1e-3): the two are different distributions (a bf16 copy of a tiny model already gives
  ~1e-2; two fp32 forwards of the same weights agree to ~1e-6), so a ratio against the sampler's log-probs is not 1
  at the first step and a correction (``rollout_correction``) belongs in the loss.
* nothing below that: float noise.

Imports torch, the standard library and ``core.rollout_correction`` (itself torch-only), so the watch stays
runnable inside the peer environments.
"""

from __future__ import annotations

import torch

from workbench.core import rollout_correction as correction
from workbench.core.errors import RolloutCorrectionError

NOISE_LOG_RATIO = 1e-3
"""max |log ρ| over the response tokens above which the sampler is not the trainer (fp32 copies: ≤ ~1e-6)."""
IS_THRESHOLD = 2.0
"""verl's default ``rollout_is_threshold``: the token weights whose mean, std and ESS share are checked."""
SOURCE = "verl docs/algo/rollout_corr.md (check_rollout_correction_health)"
# (metric without the prefix, test, bound, how the bound reads): verl's health check, see the module docstring
HEALTH = (
    ("chi2_token", lambda value: value > 1.0, "> 1.0"),
    ("rollout_is_eff_sample_size", lambda value: value < 0.3, "< 0.3"),
    ("kl", lambda value: abs(value) > 0.1, "|·| > 0.1"),
    ("rollout_is_mean", lambda value: not 0.5 <= value <= 2.0, "outside [0.5, 2.0]"),
    ("rollout_is_std", lambda value: value > 1.0, "> 1.0"),
)
EVIDENCE = ("chi2_token", "chi2_seq", "kl", "k3_kl", "rollout_is_eff_sample_size", "rollout_is_mean", "rollout_is_std",
            "log_ppl_abs_diff")


def diagnose(log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor) -> tuple[str | None, dict, list[str]]:
    """(severity or None, evidence, the health thresholds crossed as text) for one rollout: ``log_prob`` the trainer's
    per-token log-probs (B, R), ``rollout_log_prob`` the sampler's, ``response_mask`` the response tokens. None
    when no response token is left, or a log-prob is NaN (no ratio can be formed; not this check's to judge)."""
    mask = response_mask.to(log_prob.device)
    if not bool(mask.bool().any()):
        return None, {}, []
    try:
        metrics = correction.correct(log_prob, rollout_log_prob.to(log_prob.device), mask, rollout_is="token",
                                     rollout_is_threshold=IS_THRESHOLD).metrics
    except RolloutCorrectionError:
        return None, {}, []
    gap = (log_prob.float() - rollout_log_prob.to(log_prob.device).float()).abs()[mask.bool()]
    evidence = {name: metrics[correction.PREFIX + name] for name in EVIDENCE}
    evidence.update(mean_abs_delta_logp=float(gap.mean()), max_abs_delta_logp=float(gap.max()), tokens=int(gap.numel()))
    crossed = [f"{name} {evidence[name]:.4g} {bound}" for name, test, bound in HEALTH if test(evidence[name])]
    if crossed:
        return "error", evidence, crossed
    return ("warning" if evidence["max_abs_delta_logp"] > NOISE_LOG_RATIO else None), evidence, []
