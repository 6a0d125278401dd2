"""scripts/learning_report.py: the "Does it matter?" section of docs/LEARNING.md, written from a run folder (a fake one here)."""

import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.catalogue import report

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "learning_report.py"
spec = importlib.util.spec_from_file_location("learning_report", SCRIPT)
learning_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(learning_report)

PREDICTION = {"consequence": "wrong answers grow longer", "direction": "+", "effect": 2.0, "se": 0.1, "threshold": 4.303,
              "mde": 0.4303, "larger": True, "seeds": 3, "task": "scratchpad", "measure": "incorrect_length", "agrees": True}
NULL = {**PREDICTION, "consequence": "EOS rate falls", "direction": "-", "effect": 0.002, "se": 0.001, "mde": 0.004303,
        "larger": False, "agrees": False, "task": "arith"}


@pytest.fixture
def run(tmp_path):
    folder = tmp_path / "20261124-101500"
    for stem, metrics in (("05_grpo", {"prediction": PREDICTION}), ("11_trunc", {"prediction": NULL}), ("02_tok", {"x": 1.0})):
        (folder / stem).mkdir(parents=True)
        (folder / stem / "metrics.json").write_text(json.dumps({"notebook": stem, "metrics": metrics, "parameters": {"seeds": [0, 1, 2]}}))
    (folder / "summary.json").write_text(json.dumps({"smoke": False, "total_seconds": 300.0, "finished": "2026-11-24T10:20:00",
                                                     "environment": {"Python": "3.11.9", "CPU cores": "2"}, "notebooks": []}))
    return folder


def test_appends_the_section_then_replaces_it_in_place(tmp_path, run):
    doc = tmp_path / "LEARNING.md"
    doc.write_text("# A policy that learns\n\nhand-written text\n")
    assert learning_report.main([str(run), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# A policy that learns\n\nhand-written text\n\n<!-- learning-report: begin -->")
    section = text[text.index(learning_report.BEGIN):text.index(learning_report.END)]
    assert "- run finished: 2026-11-24 10:20:00" in section and "- mode: full; seeds per training notebook: 3" in section
    assert "Python 3.11.9 · CPU cores 2" in section and "runs/20261124-101500" in section
    assert "1 of 2 predicted consequences larger than seed noise, as predicted (0 opposite, 1 null)" in section
    assert "| 05_grpo | wrong answers grow longer | scratchpad | + | 2 ± 0.1 | 0.43 | 3 | larger, as predicted |" in section
    assert "| 11_trunc | EOS rate falls | arith | - | 0.002 ± 0.001 | 0.0043 | 3 | no effect > 0.0043 |" in section
    assert "02_tok" not in section and str(tmp_path) not in text  # no prediction: no row; no path of this machine
    prose = [line for line in section.splitlines() if not line.startswith("|")]  # a table row is one line, however long
    assert max(map(len, prose)) <= learning_report.WIDTH
    # a second run replaces the section, and what follows it stays
    doc.write_text(doc.read_text() + "\n## After\n")
    (run / "05_grpo" / "metrics.json").write_text(json.dumps({"metrics": {"prediction": {**PREDICTION, "effect": -2.0}}}))
    assert learning_report.main([str(run), "--doc", str(doc)]) == 0
    again = doc.read_text()
    assert again.count(learning_report.BEGIN) == 1 and again.count(learning_report.END) == 1
    assert "larger, opposite to the prediction" in again and "larger, as predicted |" not in again
    assert again.startswith("# A policy that learns\n\nhand-written text\n") and again.endswith("\n## After\n")


def test_without_summary_the_mode_says_not_recorded(tmp_path, run):
    (run / "summary.json").unlink()
    doc = tmp_path / "L.md"
    doc.write_text("x\n")
    assert learning_report.main([str(run), "--doc", str(doc)]) == 0
    assert "- mode: not recorded (no summary.json)" in doc.read_text() and "newest metrics.json" in doc.read_text()


def test_bad_run_folder_exits_2_naming_the_path_and_the_fix(tmp_path):
    doc = tmp_path / "L.md"
    doc.write_text("x\n")
    missing = tmp_path / "nope"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(SCRIPT), str(missing), "--doc", str(doc)], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and f"{missing}: no such folder" in done.stderr and "python -m workbench run" in done.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    done = subprocess.run([sys.executable, str(SCRIPT), str(empty), "--doc", str(doc)], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "holds no <notebook>/metrics.json" in done.stderr
    assert doc.read_text() == "x\n"  # nothing written


def test_no_prediction_and_broken_markers_exit_2(tmp_path, run, capsys):
    doc = tmp_path / "L.md"
    for stem in ("05_grpo", "11_trunc"):
        (run / stem / "metrics.json").unlink()
        (run / stem).rmdir()
    doc.write_text("x\n")
    assert learning_report.main([str(run), "--doc", str(doc)]) == 2
    assert "records metrics['prediction']" in capsys.readouterr().err
    (run / "05_grpo").mkdir()
    (run / "05_grpo" / "metrics.json").write_text(json.dumps({"metrics": {"prediction": PREDICTION}}))
    doc.write_text(f"x\n{learning_report.END}\n{learning_report.BEGIN}\n")
    assert learning_report.main([str(run), "--doc", str(doc)]) == 2
    assert f"{doc}:2: the markers are broken" in capsys.readouterr().err
    assert learning_report.main([str(run), "--doc", str(tmp_path / "missing.md")]) == 2
    assert "missing.md: no such file" in capsys.readouterr().err


def test_reads_the_summary_the_runner_writes(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from workbench.catalogue import batch

    out = tmp_path / "run"
    (out / "05_grpo").mkdir(parents=True)
    payload = {"notebook": "05_grpo", "reproduced": True, "fixed": True, "metrics": {"prediction": PREDICTION}}
    (out / "05_grpo" / "metrics.json").write_text(json.dumps(payload))
    result = batch.NotebookResult(stem="05_grpo", purpose="p", out_dir=str(out / "05_grpo"), parameters={}, seconds=1.0,
                                  ok=True, metrics=payload)
    batch._write_outputs(out, [result], 2.0, smoke=True)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["environment"]["CPU cores"] == str(os.cpu_count()) and summary["finished"][:2] == "20"
    assert summary["environment"]["CPU"] == report.cpu_model()
    assert "Does it matter?" in (out / "index.html").read_text()
    doc = tmp_path / "L.md"
    doc.write_text("x\n")
    assert learning_report.main([str(out), "--doc", str(doc)]) == 0
    flat = " ".join(doc.read_text().split())  # the environment line wraps where this machine's names make it long
    assert "- mode: smoke;" in flat and f"CPU cores {os.cpu_count()}" in flat
    assert f"CPU {report.cpu_model()} · CPU cores" in flat


def test_cpu_model_names_the_processor(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: Fake EPYC 9000\nflags\t: sse avx2 fma\n"
                    "processor\t: 1\nmodel name\t: Fake EPYC 9000\nflags\t: sse avx2 fma\n")
    assert report.cpu_model(str(info)) == "Fake EPYC 9000 (AVX2)"
    info.write_bytes(b"model name\t: Fake \xff Xeon\nflags\t: avx2 avx512f\n")  # a byte that is not UTF-8: no crash
    assert report.cpu_model(str(info)) == "Fake \ufffd Xeon (AVX-512)"
    info.write_text("model name\t: Fake Atom\nflags\t: sse4_2\n")
    assert report.cpu_model(str(info)) == "Fake Atom"
    missing = report.cpu_model(str(tmp_path / "absent"))  # not Linux: the platform's word, else "unknown"
    assert missing == (platform.processor() or "unknown")
