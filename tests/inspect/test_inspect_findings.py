"""Each check of workbench.inspect on a dump with its fault planted (the pitfall named, its numbers in the evidence)
and on the clean dump (no finding at all); the streamed rollout_corr/ metrics against mismatch_metrics on the tensors."""

import numpy as np
import pytest

from workbench.core.rollout_correction import mismatch_metrics
from workbench.inspect import inspect, synthetic
from workbench.inspect.findings import K3_ERROR
from workbench.inspect.gaps import GapSums, padded_logprobs

EXPECTED = {"mismatch": ("P12", "error"), "growing_gap": ("P37", "error"), "no_stop": ("S3", "warning"),
            "after_eos": ("S3", "error"), "truncation_rewarded": ("P11", "warning"), "pad_eos": ("P8", "error"),
            "double_bos": ("P21", "error"), "prompt_in_mask": ("S4", "error"), "near_zero_std": ("P16", "error"),
            "stale": ("P28", "warning")}


def _report(fault):
    return inspect(list(synthetic.records(fault, seed=3)), show_progress=False)


def test_clean_dump_has_no_finding():
    report = _report(None)
    assert report.findings == []
    assert report.metrics["rollout_corr/k3_kl"] < 1e-4
    assert report.observed["responses"] == 6 * 8 * 4


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_each_planted_fault_is_named(fault):
    report = _report(fault)
    assert EXPECTED[fault] in {(item.pitfall, item.severity) for item in report.findings}
    assert not [item for item in report.findings if item.pitfall not in (EXPECTED[fault][0], "P12")]


def test_evidence_carries_the_numbers():
    by_id = {fault: {item.pitfall: item for item in _report(fault).findings} for fault in ("mismatch", "stale", "pad_eos", "double_bos")}
    mismatch = by_id["mismatch"]["P12"].evidence
    assert mismatch["k3_kl"] > K3_ERROR and mismatch["top_tokens"][0]["token_id"] == synthetic.EOS
    assert by_id["stale"]["P28"].evidence["max_lag"] == 3 and by_id["stale"]["P28"].evidence["stale_share"] == 1.0
    assert by_id["pad_eos"]["P8"].evidence["eos_masked_share"] == 1.0 and by_id["pad_eos"]["P8"].evidence["eos_token_id"] == 2
    assert by_id["double_bos"]["P21"].evidence["double_bos_share"] == 1.0


@pytest.mark.parametrize("fault", [None, "mismatch", "pad_eos"])
def test_streamed_metrics_equal_mismatch_metrics_per_step(fault):
    rows = list(synthetic.records(fault, steps=3, seed=5))
    rows[0]["loss_mask"] = [0] * len(rows[0]["loss_mask"])  # an empty row counts as verl counts it
    report = inspect(rows, show_progress=False)
    for step in range(3):
        expected = mismatch_metrics(*padded_logprobs([row for row in rows if row["step"] == step]))
        assert report.per_step[step].keys() == expected.keys()
        for name, value in expected.items():
            assert report.per_step[step][name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    whole = mismatch_metrics(*padded_logprobs(rows))
    for name, value in whole.items():
        assert report.metrics[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name


def test_gap_sums_by_hand():
    sums = GapSums()
    sums.add(np.array([-1.0, -2.0]), np.array([-1.5, -2.0]))  # log ρ = [0.5, 0]
    metrics = sums.metrics()
    assert metrics["rollout_corr/kl"] == pytest.approx(-0.25)
    assert metrics["rollout_corr/k3_kl"] == pytest.approx((np.exp(0.5) - 1.5) / 2)
    assert metrics["rollout_corr/log_ppl_diff"] == pytest.approx(-0.25)  # rollout row mean − trainer row mean
    assert metrics["rollout_corr/chi2_seq"] == pytest.approx(np.exp(1.0) - 1)


def test_scalars_carry_the_metrics_and_the_counts():
    scalars = _report("pad_eos").scalars()
    assert scalars["inspect/errors"] == 1.0 and scalars["inspect/P8"] == 1.0
    assert scalars["rollout_corr/k3_kl"] == pytest.approx(5e-5, rel=0.2) and 0 < scalars["inspect/finish_length_share"] < 0.2
