"""verl 0.9.1's rollout correction (``verl.trainer.ppo.rollout_corr_helper``) against ``workbench.core.rollout_correction``.

For every case of ``rollout_correction_cases`` (tensors drawn here, from the probe's seed) and every setting
verl accepts — ``rollout_is`` None / token / sequence × truncating and IcePop thresholds × batch
normalisation, × ``rollout_rs`` None / each of the 11 criteria / a one-bound k1, an asymmetric k1 and two
chains — both sides get the same tensors: verl's ``compute_rollout_correction_and_rejection_mask`` and
``compute_rollout_corr_metrics_from_logprobs``, and the workbench's ``correct`` and ``mismatch_metrics``.
One row per case: how many settings ran, the largest relative difference of the weights (on response tokens;
padding apart), the masks that differ, the metric names only one side has, the largest relative metric
difference, the settings only one side refused, and for ``bf16`` the same against verl fed the fp32 upcast.
"""

from __future__ import annotations

import warnings

import torch

from workbench.core import rollout_correction as rc
from workbench.peers import protocol
from workbench.peers.adapters.rollout_correction_cases import CASES, cases, compare_metrics, tensor_relative

DEFAULT_SEED = 20260554
RS_BOUNDS = {"token_k1": "0.5_2.0", "token_k2": 0.05, "token_k3": 0.05, "seq_sum_k1": "0.5_2.0", "seq_sum_k2": 0.5,
             "seq_sum_k3": 0.5, "seq_mean_k1": "0.9_1.1", "seq_mean_k2": 0.05, "seq_mean_k3": 0.05, "seq_max_k2": 0.5,
             "seq_max_k3": 0.5}


def import_peer():
    from verl.trainer.ppo import rollout_corr_helper  # noqa: F401


def is_settings() -> list[dict]:
    settings = [{}]
    for level in ("token", "sequence"):
        for threshold in (2.0, "1.5", "0.5_2.0"):
            for normalize in (False, True):
                settings.append({"rollout_is": level, "rollout_is_threshold": threshold, "rollout_is_batch_normalize": normalize})
    return settings


def rs_settings() -> list[dict]:
    settings = [{}] + [{"rollout_rs": name, "rollout_rs_threshold": bound} for name, bound in RS_BOUNDS.items()]
    settings += [{"rollout_rs": "token_k1", "rollout_rs_threshold": 2.0},
                 {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.8_1.5"},
                 {"rollout_rs": "token_k1,seq_mean_k3,seq_max_k2", "rollout_rs_threshold": "0.5_2.0,0.05,0.5"},
                 {"rollout_rs": ",".join(RS_BOUNDS), "rollout_rs_threshold": ",".join(str(b) for b in RS_BOUNDS.values())}]
    return settings


def run_verl(old, rollout, mask, setting):
    from verl.trainer.ppo.rollout_corr_helper import (  # verl: its peer environment only
        compute_rollout_correction_and_rejection_mask,
    )

    weights, new_mask, metrics = compute_rollout_correction_and_rejection_mask(old, rollout, mask, **setting)
    return (None if weights is None else weights.batch["rollout_is_weights"]), new_mask, metrics


def case_row(name, old, rollout, mask) -> dict:
    from verl.trainer.ppo.rollout_corr_helper import (  # verl: its peer environment only
        compute_rollout_corr_metrics_from_logprobs,
    )

    keep = mask.bool()
    worst = {"value": 0.0, "metric": "", "setting": ""}
    worst_upcast = {"value": 0.0, "metric": "", "setting": ""}
    examples: list = []
    counts = dict(settings=0, compared=0, weight_rel=0.0, padding_weight_differs=0, masks_differ=0, key_mismatches=0,
                  refused_by_verl_only=0, refused_by_workbench_only=0, refused_by_both=0, verl_nan_weights=0,
                  verl_nan_metrics=0, weight_rel_vs_upcast=0.0)
    refusals = set()
    for is_setting in is_settings():
        for rs_setting in rs_settings():
            setting = {**is_setting, **rs_setting}
            label = ", ".join(f"{k}={v}" for k, v in setting.items()) or "no correction"
            counts["settings"] += 1
            try:
                theirs = run_verl(old, rollout, mask, setting)
            except Exception as exc:  # noqa: BLE001 - a refusal is a measurement here
                theirs = exc
            try:
                ours = rc.correct(old, rollout, mask, **setting)
            except rc.RolloutCorrectionError as exc:
                ours = exc
                refusals.add(str(exc).split(":")[0][:80])
            if isinstance(theirs, Exception) or isinstance(ours, Exception):
                key = ("refused_by_both" if isinstance(theirs, Exception) and isinstance(ours, Exception) else
                       "refused_by_verl_only" if isinstance(theirs, Exception) else "refused_by_workbench_only")
                counts[key] += 1
                if not isinstance(theirs, Exception):
                    counts["verl_nan_weights"] += int(theirs[0] is not None and bool(torch.isnan(theirs[0][keep]).any()))
                    counts["verl_nan_metrics"] += int(any(v != v for v in theirs[2].values()))
                continue
            counts["compared"] += 1
            weights, new_mask, metrics = theirs
            if (weights is None) != (ours.weights is None):
                counts["key_mismatches"] += 1
            elif weights is not None:
                counts["weight_rel"] = max(counts["weight_rel"], tensor_relative(weights, ours.weights, keep))
                counts["padding_weight_differs"] += int(tensor_relative(weights, ours.weights, ~keep) > 0)
            counts["masks_differ"] += int(not torch.equal(new_mask.float(), ours.mask.float()))
            counts["key_mismatches"] += compare_metrics(metrics, ours.metrics, label, worst, examples)
            if old.dtype == torch.bfloat16:
                upcast = run_verl(old.float(), rollout.float(), mask, setting)
                if upcast[0] is not None:
                    counts["weight_rel_vs_upcast"] = max(counts["weight_rel_vs_upcast"],
                                                         tensor_relative(upcast[0], ours.weights, keep))
                compare_metrics(upcast[2], ours.metrics, label, worst_upcast, [])
    try:
        gap: dict = {"value": 0.0}
        compare_metrics(compute_rollout_corr_metrics_from_logprobs(old, rollout, mask), rc.mismatch_metrics(old, rollout, mask),
                        "mismatch_metrics", gap, examples)
        mismatch = gap["value"]
    except Exception as exc:  # noqa: BLE001 - a refusal is a measurement here
        mismatch = f"{type(exc).__name__}: {str(exc)[:120]}"
    return protocol.audit_row("rollout_correction", None, case=name, dtype=str(old.dtype).removeprefix("torch."),
                              rows=int(mask.shape[0]), response_tokens=int(mask.sum()), **counts,
                              metric_rel=worst["value"], worst_metric=worst["metric"], worst_setting=worst["setting"],
                              metric_rel_vs_upcast=worst_upcast["value"], mismatch_metrics_rel=mismatch,
                              workbench_refusals=sorted(refusals), examples=examples)


def probes(args) -> list[dict]:
    warnings.filterwarnings("ignore")
    drawn = cases(int(args.get("seed", DEFAULT_SEED)))
    return [case_row(name, *drawn[name]) for name in args.get("cases", CASES)]


if __name__ == "__main__":
    protocol.run_adapter(import_peer, probes, ["verl", "torch"])
