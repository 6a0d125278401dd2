"""Dumps unlike the synthetic ones: probabilities where log-probs belong, a constant reward for truncated responses,
a gap growing over three steps, an engine that strips the EOS, binary rewards with a bf16-sized gap (still clean)."""

import numpy as np
import pytest

from workbench.inspect import DumpError, inspect


def _row(step, group, response, reward, rng, noise=0.01, finish="stop", **extra):
    sampled = -np.abs(rng.normal(0.7, 0.5, len(response)))
    return {"step": step, "group": group, "prompt_ids": [1, 7, 8], "response_ids": response, "reward": reward,
            "rollout_logprobs": sampled.tolist(), "trainer_logprobs": (sampled + rng.normal(0, noise, len(response))).tolist(),
            "finish": finish} | extra


def test_probabilities_instead_of_logprobs_are_bad_input():
    rng = np.random.default_rng(0)
    row = _row(0, 0, [5, 6, 2], 1.0, rng)
    row["rollout_logprobs"] = [0.4, 0.9, 0.7]
    with pytest.raises(DumpError, match=r"record 0: .*rollout_logprobs.* > 0 at 3 of 3"):
        inspect([row], show_progress=False)


def test_binary_rewards_and_a_bf16_gap_are_clean():
    rng = np.random.default_rng(1)
    rows = [_row(step, f"{step}-{g}", [*rng.integers(3, 50, int(rng.integers(2, 30))).tolist(), 2],
                 float(rng.random() < 0.5), rng, noise=0.02) for step in range(4) for g in range(8) for _ in range(4)]
    report = inspect(rows, show_progress=False)
    assert report.errors == [], [str(item) for item in report.errors]


def test_constant_reward_for_truncated_responses_and_growth_over_three_steps():
    rng = np.random.default_rng(2)
    rows = []
    for step in range(3):
        for g in range(8):
            for member in range(4):
                truncated = member == 0
                response = rng.integers(3, 50, 16).tolist() + ([] if truncated else [2])
                rows.append(_row(step, f"{step}-{g}", response, 1.0 if truncated else float(member % 2), rng,
                                 noise=(0.01, 0.08, 0.3)[step], finish="length" if truncated else "stop"))
    found = {item.pitfall: item for item in inspect(rows, show_progress=False).findings}
    assert found["P11"].evidence["truncated_reward_min"] == 1.0 and found["P11"].evidence["finished_reward_min"] == 0.0
    assert found["P37"].evidence["steps"] == 3 and found["P37"].evidence["growth"] > 100


def test_an_engine_that_strips_the_eos_leaves_s3_unobserved():
    rng = np.random.default_rng(3)
    rows = [_row(0, g, rng.integers(3, 50, 8).tolist(), float(g % 2 + rng.random()), rng) for g in range(16)]
    report = inspect(rows, show_progress=False)
    assert any(entry["pitfall"] == "S3" and "--eos-token-id" in entry["why"] for entry in report.not_observable)
    assert not [item for item in report.findings if item.pitfall in ("S3", "P8")]


def test_a_bf16_sized_gap_is_named_as_info():
    rng = np.random.default_rng(4)
    rows = [_row(0, g, [*rng.integers(3, 50, 20).tolist(), 2], float(g % 3), rng, noise=0.02) for g in range(32)]
    (p12,) = [item for item in inspect(rows, show_progress=False).findings if item.pitfall == "P12"]
    assert p12.severity == "info" and 1e-4 <= p12.evidence["k3_kl"] < 1e-3


def test_a_folder_of_step_files_is_read_in_step_order(tmp_path):
    from workbench.inspect import export, synthetic
    from workbench.inspect.readers import read

    rows = list(synthetic.records(None, steps=3, groups=1))
    for step in (2, 10, 1):  # lexical order would put 10 before 2
        export.write_jsonl([row for row in rows if row["step"] == step % 3], tmp_path / f"rollouts-{step}.jsonl")
    assert [rollout.where.split("rollouts-")[1].split(".")[0] for rollout in read(tmp_path, show_progress=False)][::4] == ["1", "2", "10"]


def _lagged(lags, noises, rng):
    """One step per entry: 8 groups of 4 responses sampled ``lag`` updates behind, with a gap of that noise."""
    return [_row(step, f"{step}-{g}", [*rng.integers(3, 50, 12).tolist(), 2], float(member % 2), rng, noise=noise,
                 policy_version=step - lag)
            for step, (lag, noise) in enumerate(zip(lags, noises, strict=True)) for g in range(8) for member in range(4)]


def test_a_gap_that_grows_only_while_the_lag_ramps_up_is_staleness_not_a_missing_sync():
    rng = np.random.default_rng(5)
    ramp = _lagged([0, 1, 2, 2, 2], [0.003, 0.1, 0.2, 0.21, 0.22], rng)  # at lag 2: x1.2, under GROWTH_RATIO
    found = {item.pitfall for item in inspect(ramp, show_progress=False).findings}
    assert "P28" in found and "P37" not in found
    growing = _lagged([2] * 6, [0.01, 0.03, 0.06, 0.1, 0.2, 0.3], np.random.default_rng(6))  # same lag, gap grows
    assert "P37" in {item.pitfall for item in inspect(growing, show_progress=False).findings}
