"""python -m workbench inspect: exit 0 on a clean dump, 1 on an error finding, 2 on bad files (file and line named),
3 when the inspector itself fails; the --json output's shape and --out's files."""

import json

import pytest

from workbench.cli.main import main
from workbench.inspect import export, synthetic


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dumps")
    return {fault: export.write_jsonl(synthetic.records(fault, steps=4, groups=4), folder / f"{fault}.jsonl")
            for fault in (None, "pad_eos", "stale")}


def test_clean_dump_exits_0_and_a_fault_1(dumps, capsys):
    assert main(["inspect", dumps[None], "--quiet"]) == 0
    assert "no pitfall observed" in capsys.readouterr().out
    assert main(["inspect", dumps["pad_eos"], "--quiet"]) == 1
    assert "[ERROR] P8" in capsys.readouterr().out
    assert main(["inspect", dumps["stale"], "--quiet"]) == 0  # a warning only
    assert "[WARNING] P28" in capsys.readouterr().out


def test_json_output_and_out_folder(dumps, capsys, tmp_path):
    assert main(["inspect", dumps["pad_eos"], "--json", "--quiet", "--out", str(tmp_path)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= {"findings", "observed", "not_observable", "metrics", "per_step"}
    (p8,) = [item for item in data["findings"] if item["pitfall"] == "P8"]
    assert set(p8) == {"pitfall", "severity", "message", "evidence", "where"} and p8["evidence"]["eos_masked_share"] == 1.0
    assert p8["where"].startswith(dumps["pad_eos"] + ":")
    assert data["metrics"]["rollout_corr/k3_kl"] < 1e-3 and set(data["per_step"]) == {"0", "1", "2", "3"}
    assert json.loads((tmp_path / "report.json").read_text())["findings"] == data["findings"]
    page = (tmp_path / "report.html").read_text()
    assert "P8" in page and "rollout_corr/ by step" in page and "k3_kl" in page


def _lines(path, count=3):
    return path.read_text().splitlines()[:count]


@pytest.mark.parametrize("damage", ["truncated_line", "short_logprobs", "not_utf8"])
def test_bad_files_exit_2_naming_file_and_line(dumps, tmp_path, capsys, damage):
    from pathlib import Path

    lines = _lines(Path(dumps[None]))
    bad = tmp_path / f"{damage}.jsonl"
    if damage == "truncated_line":
        lines[2] = lines[2][: len(lines[2]) // 2]
        bad.write_text("\n".join(lines) + "\n")
    elif damage == "short_logprobs":
        record = json.loads(lines[2])
        record["rollout_logprobs"] = record["rollout_logprobs"][:-1]
        lines[2] = json.dumps(record)
        bad.write_text("\n".join(lines) + "\n")
    else:
        bad.write_bytes(("\n".join(lines[:2]) + "\n").encode() + '{"group": "caf\xe9"}\n'.encode("latin-1"))
    assert main(["inspect", str(bad), "--quiet"]) == 2
    error = capsys.readouterr().err
    assert f"{bad}:3:" in error
    assert {"truncated_line": "not valid JSON", "short_logprobs": "rollout_logprobs", "not_utf8": "not UTF-8"}[damage] in error


def test_missing_file_and_unknown_format_exit_2(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nothing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_inspector_failure_exits_3(dumps, capsys, monkeypatch):
    from workbench.inspect import findings

    def broken(self, rollout):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(findings.Staleness, "add", broken)
    assert main(["inspect", dumps[None], "--quiet"]) == 3
    assert "the inspector failed" in capsys.readouterr().err


def test_report_to_logs_each_steps_diagnostics_and_the_counts(dumps, capsys, tmp_path, monkeypatch):
    pytest.importorskip("trackio")
    from tracker_history import point_trackio_at, trackio_history

    from workbench.inspect.report import InspectReport

    point_trackio_at(tmp_path / "trackio", monkeypatch)
    monkeypatch.setenv("TRACKIO_PROJECT", "inspect-cli")
    assert main(["inspect", dumps["pad_eos"], "--json", "--quiet", "--report-to", "trackio"]) == 1
    report = InspectReport.from_dict(json.loads(capsys.readouterr().out))
    logged = trackio_history("inspect-cli", "inspect")
    assert sorted(logged) == [0, 1, 2, 3] and logged[3]["inspect/P8"] == 1.0 and logged[3]["inspect/errors"] >= 1
    for step, values in report.per_step.items():  # each step's diagnostics at its step
        assert {name: logged[step][name] for name in values} == pytest.approx(values, rel=1e-12)
    overall = {f"overall/{name}": value for name, value in report.metrics.items()}  # the whole dump's, at the last step
    assert overall and {name: logged[3][name] for name in overall} == pytest.approx(overall, rel=1e-12)


def test_an_undefined_metric_says_why_never_nan():
    from workbench.inspect.report import InspectReport

    report = InspectReport(metrics={"rollout_corr/k3_kl": float("nan")}, per_step={0: {"rollout_corr/k3_kl": 0.5}, 1: {}})
    assert "rollout_corr/k3_kl=n/a (not measured)" in str(report)
    assert "<td>n/a (not measured at this step)</td>" in report.html() and "nan" not in report.html().lower()
