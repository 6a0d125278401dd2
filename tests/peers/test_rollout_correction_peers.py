"""The rollout-correction probes: their verdicts (pure, fed matching and differing numbers) and, where the peer
environments exist, verl 0.9.1 and TRL 1.16 themselves against ``workbench.core.rollout_correction`` on tensors the
probes draw from their own seed (skipped with the reason when an environment is missing)."""

import importlib.util

import pytest

from workbench.peers import envs, lab
from workbench.peers import expectations as peer_lab

EQUAL = {"case": "heavy_tailed", "dtype": "float32", "settings": 208, "compared": 208, "weight_rel": 0.0, "metric_rel": 0.0,
         "masks_differ": 0, "key_mismatches": 0, "mismatch_metrics_rel": 0.0, "padding_weight_differs": 0,
         "refused_by_workbench_only": 0, "verl_nan_weights": 0, "verl_nan_metrics": 0, "weight_rel_vs_upcast": 0.0,
         "metric_rel_vs_upcast": 0.0}
TRL_EQUAL = {"case": "nan", "settings": 12, "ratio_rel": 0.0, "metric_rel": 0.0, "key_mismatches": 0, "mask_mismatches": 0,
             "off_policy_differs": 0, "off_policy_settings": 3, "padding_ratio_differs": 12}


def verdict(peer, probe, measured):
    return peer_lab.judge(peer, "x", {"probe": probe, "measured": measured, "audit": None})["verdict"]


def test_verl_parity_rows_judge_both_ways():
    assert verdict("verl", "rollout_correction", EQUAL) == peer_lab.AS_EXPECTED
    assert verdict("verl", "rollout_correction", {**EQUAL, "metric_rel": 2e-5}) == peer_lab.DIFFERS
    assert verdict("verl", "rollout_correction", {**EQUAL, "masks_differ": 1}) == peer_lab.DIFFERS
    assert verdict("verl", "rollout_correction", {**EQUAL, "compared": 207}) == peer_lab.DIFFERS
    padding = {**EQUAL, "case": "nan_padding"}
    assert verdict("verl", "rollout_correction", {**padding, "padding_weight_differs": 64}) == peer_lab.AS_EXPECTED
    assert verdict("verl", "rollout_correction", padding) == peer_lab.DIFFERS  # the finding is gone: re-examine
    nan = {**EQUAL, "case": "nan", "compared": 0, "refused_by_workbench_only": 208, "verl_nan_metrics": 208}
    assert verdict("verl", "rollout_correction", nan) == peer_lab.AS_EXPECTED
    bf16 = {**EQUAL, "case": "bf16", "dtype": "bfloat16", "weight_rel": 4e-3, "masks_differ": 13, "metric_rel": 1.0}
    assert verdict("verl", "rollout_correction", bf16) == peer_lab.AS_EXPECTED
    assert verdict("verl", "rollout_correction", {**bf16, "weight_rel_vs_upcast": 1e-3}) == peer_lab.DIFFERS


def test_trl_parity_rows_judge_both_ways():
    assert verdict("trl", "trl_rollout_correction", TRL_EQUAL) == peer_lab.AS_EXPECTED
    assert verdict("trl", "trl_rollout_correction", {**TRL_EQUAL, "ratio_rel": 1e-3}) == peer_lab.DIFFERS
    assert verdict("trl", "trl_rollout_correction", {**TRL_EQUAL, "off_policy_differs": 1}) == peer_lab.DIFFERS


def run_or_skip(key):
    run = next(r for r in lab.plan() if r.key == key)
    if run.env == "host" and importlib.util.find_spec("trl") is None:
        pytest.skip("TRL is not installed (pip install -e '.[peers]')")
    if run.env != "host":
        status = envs.locate(envs.get_spec(run.env))
        if not status.ready:
            pytest.skip(status.reason)
    rows, payloads = lab.run_lab(only=[key], reuse=True)
    if payloads[key]["status"] == "skipped":
        pytest.skip(payloads[key]["reason"])
    assert payloads[key]["status"] == "ok", payloads[key].get("reason")
    return rows


@pytest.mark.parametrize("key", ["verl-0.9.1-rollout-correction", "trl-1.16-rollout-correction"])
def test_the_workbench_matches_the_peer_on_hidden_tensors(key):
    rows = run_or_skip(key)
    planned = next(r for r in lab.plan() if r.key == key).planned
    assert len(rows) == len(planned)
    differing = [r for r in rows if r["verdict"] != peer_lab.AS_EXPECTED]
    assert not differing, differing
