"""Notebook 94 (engine lab): the verdict on measured numbers, the "not run" path without the engine, the printers,
``metrics()`` and the figure; with the engine environment, the four findings reproduced and fixed in smoke mode."""

import math

import matplotlib.pyplot as plt
import pytest

from workbench.engines import envs
from workbench.pitfalls import nb94_engine_lab as lab

MEASURED = {  # the shape engine_findings returns, with numbers of the size the engine gives
    "ran": True, "reason": "", "model": "tiny-arith-qwen2-hd32",
    "engine": {"vllm": "0.32.0", "dtype": "float32", "logprobs_mode": "processed_logprobs", "prefix_caching": True},
    "temperature": {"bug": 1.59, "fix": 1.9e-6, "raw_vs_untempered": 2e-6, "temperature": 0.6},
    "prefix_cache": {"bug": 3.2, "fix": 2e-6, "prompt_tokens": 160, "cached_bug": 144, "cached_fix": 0},
    "dtype_auto": {"bug": 2.5e-2, "fix": 2e-6, "loaded": "bfloat16", "checkpoint": "float32"},
    "trl_sync": {"error": "AttributeError: 'Parameter' object has no attribute 'weight_loader'", "synced": False,
                 "bug": float("nan"), "fix": 2e-6},
}


def test_verdict_on_measured_numbers():
    assert lab.verdict(MEASURED) == (True, True)
    unfixed = {**MEASURED, "prefix_cache": {**MEASURED["prefix_cache"], "fix": 0.5}}
    assert lab.verdict(unfixed) == (True, False)
    auto_was_fp32 = {**MEASURED, "dtype_auto": {**MEASURED["dtype_auto"], "loaded": "float32", "bug": 1e-6}}
    assert lab.verdict(auto_was_fp32)[0] is False
    trl_worked = {**MEASURED, "trl_sync": {**MEASURED["trl_sync"], "synced": True, "bug": 1e-6, "error": ""}}
    assert lab.verdict(trl_worked)[0] is False


def test_lines_and_metrics_carry_each_number():
    text = lab.finding_lines(MEASURED)
    for number in ("1.59", "144 of 160", "bfloat16", "weight_loader", "1.9e-06"):
        assert number in text
    m = lab.metrics(MEASURED)
    assert m["reproduced"] and m["fixed"] and m["headline"]["bug"] == 1.59
    assert set(lab.FINDINGS) <= set(m["metrics"])


def test_figure_of_measured_numbers():
    fig = lab.figure_engine_lab(MEASURED)
    assert len(fig.axes) == 4
    plt.close(fig)


def test_without_the_engine_it_reads_not_run(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBENCH_ENGINES_DIR", str(tmp_path))
    findings = lab.engine_findings(smoke=True)
    assert findings["ran"] is False and findings["reason"].startswith("not run: `make engines`")
    assert lab.finding_lines(findings).startswith("not run: `make engines`")
    m = lab.metrics(findings)
    assert m["metrics"]["skipped"].startswith("not run") and not m["reproduced"]
    fig = lab.figure_engine_lab(findings)
    assert all("not run" in " ".join(t.get_text() for t in ax.texts) for ax in fig.axes)
    plt.close(fig)


STATUS = envs.locate()


@pytest.mark.skipif(not STATUS.ready, reason=f"engine environment absent: {STATUS.reason}")
@pytest.mark.slow
def test_engine_reproduces_and_fixes_each_finding_in_smoke_mode():
    findings = lab.engine_findings(smoke=True)
    print(lab.finding_lines(findings))
    assert lab.verdict(findings) == (True, True), findings
    assert all(math.isfinite(findings[k]["fix"]) for k in lab.FINDINGS)
