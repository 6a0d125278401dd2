"""Notebook 93's module: records turned into gaps, lengths and the pad = EOS mask; the verdict on the inspector's
findings; figures, printers, explorer and metrics. The GRPO runs themselves: one slow test (and the notebook's)."""

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.core.rollout_correction import mismatch_metrics  # noqa: E402
from workbench.inspect.report import InspectReport  # noqa: E402
from workbench.pitfalls import nb93_inspect_a_run as p93  # noqa: E402
from workbench.watch.report import Finding  # noqa: E402


def record(step, group, response, sampled, trained, reward, finish, mask=None):
    return {"step": step, "group": group, "prompt_ids": [1, 5], "response_ids": response, "rollout_logprobs": sampled,
            "trainer_logprobs": trained, "loss_mask": mask or [1] * len(response), "reward": reward, "finish": finish,
            "temperature": 1.0, "policy_version": step}


RECORDS = [record(0, 0, [7, 2], [-0.5, -0.25], [-0.5, -0.75], 1.0, "stop"),
           record(0, 0, [7, 7, 7], [-1.0, -2.0, -0.5], [-1.5, -2.0, -0.5], 0.0, "length"),
           record(1, 0, [8, 2], [-0.25, -0.125], [-0.25, -0.125], 1.0, "stop", mask=[1, 0])]


def fake_reports(**changes) -> dict:
    """Reports naming every planted fault (the clean one with a P16 warning only), then ``changes`` per run."""
    found = {"clean": [Finding("P16", "warning", "no signal", {"groups": 2})]}
    for fault, (_, pitfall) in p93.FAULTS.items():
        found[fault] = [Finding(pitfall, "warning", f"{fault}", {"share": 0.5})]
    found.update(changes)
    return {run: InspectReport(findings=findings, metrics={"rollout_corr/k3_kl": 2e-4}) for run, findings in found.items()}


def test_pad_equals_eos_masks_every_eos_and_nothing_else():
    masked = p93.pad_equals_eos(RECORDS, eos_token_id=2)
    assert [r["loss_mask"] for r in masked] == [[1, 0], [1, 1, 1], [1, 0]]
    assert RECORDS[0]["loss_mask"] == [1, 1]  # the input records are left as they were


def test_token_gaps_are_the_absolute_log_ratio_on_trained_tokens():
    gaps = p93.token_gaps(RECORDS)
    assert gaps.shape == (3, 3)
    assert gaps[0, :2].tolist() == [0.0, 0.5] and math.isnan(gaps[0, 2])
    assert gaps[1].tolist() == [0.5, 0.0, 0.0] and math.isnan(gaps[2, 1])  # out of the loss mask


def test_gap_by_step_is_verls_mismatch_metrics_on_each_step():
    per_step = p93.gap_by_step(RECORDS)
    trained = torch.tensor([[-0.5, -0.75, 0.0], [-1.5, -2.0, -0.5]], dtype=torch.float64)
    sampled = torch.tensor([[-0.5, -0.25, 0.0], [-1.0, -2.0, -0.5]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.float64)
    expected = mismatch_metrics(trained, sampled, mask)
    assert per_step[0]["rollout_corr/k3_kl"] == pytest.approx(float(expected["rollout_corr/k3_kl"]))
    assert per_step[0]["abs_log_ratio_mean"] == pytest.approx(1.0 / 5)  # 0.5 + 0.5 over 5 trained tokens
    assert per_step[1]["abs_log_ratio_mean"] == 0.0


def test_length_counts_split_by_finish_and_reward():
    assert p93.length_counts(RECORDS) == {("stop", True): {2: 2}, ("length", False): {3: 1}}


def test_verdict_needs_every_fault_named_and_a_clean_dump_without_errors():
    assert p93.verdict(fake_reports()) == (True, True)
    missed = fake_reports(**{"bf16 sampler": [Finding("P16", "warning", "no signal", {})]})
    assert p93.verdict(missed) == (False, True)
    line = "bf16 sampler: P12 MISSED — k3 KL 0.0002 per token (the inspector's bounds: info 0.0001, warning 0.001)"
    assert line in p93.named_lines(missed)
    dirty = fake_reports(clean=[Finding("S3", "error", "continued after EOS", {})])
    assert p93.verdict(dirty) == (True, False) and "clean: 1 finding(s) of error severity" in p93.named_lines(dirty)


def test_figures_printers_explorer_and_metrics(tmp_path):
    dumps = {run: RECORDS for run in p93.RUNS}
    reports = fake_reports()
    per_step = {run: p93.gap_by_step(RECORDS) for run in p93.GAP_RUNS}
    for fig in (p93.figure_gap_heatmaps(dumps), p93.figure_gap_over_steps(per_step), p93.figure_lengths(dumps)):
        assert fig.axes
    heat = p93.figure_gap_heatmaps(dumps)
    assert heat.axes[0].images[0].get_array().shape == (3, 3) and heat.axes[0].images[0].get_clim() == (0.0, 0.5)
    assert "clean 0.5" in p93.heatmap_note(dumps)
    assert "clean: 3 responses over 2 steps, 7 response tokens → dumps/clean/" in p93.dumps_lines(dumps)
    assert "pad = EOS" in p93.dumps_lines(dumps) and "dumps/pad_equals_eos/" in p93.dumps_lines(dumps)
    table = p93.findings_table(reports)
    assert table.count("\n") == len(p93.RUNS) and "share=0.5" in table
    assert p93.gap_lines(per_step).startswith("clean: k3 KL")
    explorer = p93.inspect_explorer(dumps, reports)
    assert explorer.last == {"run": "clean", "responses": 3, "findings": 1}
    explorer.controls["up_to_step"].value = 0
    assert explorer.last["responses"] == 2
    written = written_metrics(p93.metrics(reports, per_step, eos_token_id=2), tmp_path)
    assert (written["reproduced"], written["fixed"]) == (True, True)
    assert written["headline"]["fix"] == 0.0 and written["metrics"]["named"]["pad = EOS"]["pitfall"] == "P8"
    plt.close("all")


@pytest.mark.slow
def test_the_planted_faults_are_named_in_real_dumps_and_the_clean_dump_has_no_error(tmp_path):
    dumps, eos = p93.dump_runs("tiny-restate-qwen2", tmp_path, steps=3, prompts_per_step=2)
    reports = p93.inspect_dumps(dumps)
    named = p93.named(reports)
    assert named["stale sampler"]["named"] and named["truncation rewarded"]["named"] and named["pad = EOS"]["named"]
    assert "error" in named["pad = EOS"]["severities"] and not reports["clean"].errors
    assert reports["clean"].metrics["rollout_corr/k3_kl"] < 1e-9 < reports["bf16 sampler"].metrics["rollout_corr/k3_kl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p93.folder_name(run) for run in p93.RUNS)
    for run in p93.GAP_RUNS:  # the figures' per-step metrics (core.rollout_correction) are the inspector's
        mine, theirs = p93.gap_by_step(dumps[run]), reports[run].per_step
        assert sorted(mine) == sorted(theirs)
        for step in mine:
            assert mine[step]["rollout_corr/k3_kl"] == pytest.approx(theirs[step]["rollout_corr/k3_kl"], rel=1e-6, abs=1e-12)
