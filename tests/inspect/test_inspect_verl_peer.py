"""workbench.inspect against verl 0.9.1 in its peer environment: a rollout_data_dir dump written by verl's own
_write_generations (both trainers) read, and the rollout_corr/ metrics of a generic dump equal to verl's
compute_rollout_corr_metrics_from_logprobs on the same tensors, step by step. Skipped with the reason when the
environment is absent."""

import pytest

from workbench.inspect import DumpError, export, inspect, synthetic
from workbench.peers import invoke

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def verl_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("verl")
    generic = export.write_jsonl(synthetic.records("mismatch", steps=3, seed=1), folder / "generic.jsonl")
    payload = invoke.run("verl-0.9.1", "verl_inspect_dump", {"folder": str(folder / "rollouts"), "generic": generic},
                         timeout=600)
    if payload["status"] != "ok":
        pytest.skip(f"verl 0.9.1 peer: {payload['status']}: {payload.get('reason', '')}")
    return folder, generic, {row["probe"]: row["measured"] for row in payload["rows"]}


def test_verl_rollout_data_dir_written_by_verl_is_read(verl_run):
    folder, _, measured = verl_run
    assert measured["rollout_data_dir"]["files"] == ["1.jsonl", "2.jsonl", "3.jsonl"]
    report = inspect(folder / "rollouts", show_progress=False)
    assert report.observed["responses"] == 48 and report.observed["text_only"] == 48 and report.observed["steps"] == 3
    assert report.findings == []  # rewards 0/1 inside every group: signal everywhere


def test_pickled_dataproto_is_refused_and_its_export_read(verl_run):
    _, _, measured = verl_run
    with pytest.raises(DumpError, match="never unpickles"):
        inspect(measured["dataproto"]["pickled"], show_progress=False)
    report = inspect(measured["dataproto"]["generic"], show_progress=False)
    assert report.observed["responses"] == 8 and report.observed["response_tokens"] == sum(measured["dataproto"]["lengths"])
    assert measured["dataproto"]["prompt_lengths"] == [3] * 4 + [5] * 4  # the left padding dropped
    (p8,) = [item for item in report.findings if item.pitfall == "P8"]
    assert p8.evidence["eos_masked_share"] == 1.0 and p8.evidence["eos_token_id"] == 2


def test_rollout_corr_equals_verls_on_the_same_tensors(verl_run):
    _, generic, measured = verl_run
    report = inspect(generic, show_progress=False)
    for step, expected in measured["rollout_corr"].items():
        ours = report.per_step[int(step)]
        assert set(ours) == set(expected)
        for name, value in expected.items():
            assert ours[name] == pytest.approx(value, rel=1e-7, abs=1e-12), (step, name)  # float64 sums in another order
    assert ("P12", "error") in {(item.pitfall, item.severity) for item in report.findings}
