"""``python -m workbench watch -- python SCRIPT``: a plain training script with planted bugs is watched from
outside (no line of it changed) and exits 1 with those findings; the same script fixed exits 0; a failing
script exits 3 and Ctrl-C exits 130, both with the report of what ran written; bad input exits 2. A process's
watches (policy and reference) overlap, so its part states the longest block's watched time."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.cli import watch_child
from workbench.cli.main import main
from workbench.watch.report import Report

ROOT = Path(__file__).resolve().parents[2]
USER_SCRIPT = ROOT / "examples" / "watch_user_trainer.py"
BUILDS_A_MODEL = """
import sys, time, torch
from workbench.modeling.tiny import tiny_model
model, tok = tiny_model("gpt2", seed=1)
model(input_ids=torch.tensor([[5, 6, 7]]))
print("ready", flush=True)
if sys.argv[1] == "fail":
    raise RuntimeError("the script's own bug")
time.sleep(120)
"""


def watch_command(out: Path, *command: str, deep: bool = False, **popen):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    args = [sys.executable, "-m", "workbench", "watch", "--out", str(out)] + (["--deep"] if deep else []) + ["--", *command]
    return subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def finished(process, timeout: float = 300):
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


# each run starts two interpreters (~20 s on 2 busy cores): the buggy run in the default suite, the rest under -m slow
@pytest.mark.parametrize("fixed", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_plain_script_buggy_then_fixed(tmp_path, fixed):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from watch_user_trainer import PLANTED
    finally:
        sys.path.remove(str(ROOT / "examples"))
    code, out, err = finished(watch_command(tmp_path, sys.executable, str(USER_SCRIPT), *(["--fixed"] if fixed else []), deep=True))
    report = json.loads((tmp_path / "report.json").read_text())
    errors = {f["pitfall"] for f in report["findings"] if f["severity"] == "error"}
    assert code == (0 if fixed else 1), err
    assert errors == (set() if fixed else set(PLANTED)), out
    assert report["observed"]["processes"] == 1 and report["observed"]["training_forwards"] >= 1
    assert all(f["where"].startswith(str(USER_SCRIPT)) for f in report["findings"])  # the script's own lines
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.slow
def test_failing_script_exits_3_with_its_report(tmp_path):
    code, out, err = finished(watch_command(tmp_path, sys.executable, "-c", BUILDS_A_MODEL, "fail"))
    assert code == 3 and "the script's own bug" in err and "script failed" in err
    assert json.loads((tmp_path / "report.json").read_text())["observed"]["forwards"] == 1


@pytest.mark.slow
def test_ctrl_c_writes_the_report_and_exits_130(tmp_path):
    process = watch_command(tmp_path, sys.executable, "-c", BUILDS_A_MODEL, "sleep", start_new_session=True)
    line = process.stdout.readline()
    assert line.strip() == "ready", process.stderr.read()
    time.sleep(0.2)
    os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: SIGINT to the foreground group
    code, out, err = finished(process, timeout=60)
    assert code == 130, err
    assert json.loads((tmp_path / "report.json").read_text())["observed"]["forwards"] == 1


def test_bad_input_exits_2(tmp_path, capsys):
    assert main(["watch", "--out", str(tmp_path)]) == 2
    assert "no command" in capsys.readouterr().err
    assert main(["watch", "--out", str(tmp_path), "--", str(tmp_path / "no-such-program")]) == 2
    assert "cannot start" in capsys.readouterr().err


class FinishedWatch:
    """Stands for a closed ``Watch`` whose block lasted ``watched`` seconds."""

    def __init__(self, watched: float, own: float):
        self.cost = {"mode": "light", "watch_seconds": own, "watched_seconds": watched}

    def close(self):
        pass

    def report(self) -> Report:
        return Report(cost=dict(self.cost))


def test_a_process_part_states_its_longest_watched_block(tmp_path, monkeypatch):
    monkeypatch.setenv(watch_child.OUT_VARIABLE, str(tmp_path))
    monkeypatch.setattr(watch_child, "WATCHES", [FinishedWatch(10.0, 1.0), FinishedWatch(8.0, 0.5)])
    part = json.loads(Path(watch_child.write_part()).read_text())
    assert part["cost"] == {"mode": "light", "watch_seconds": 1.5, "watched_seconds": 10.0}
    assert part["observed"]["models_watched"] == 2


def test_report_to_logs_the_reports_counters_and_a_missing_tracker_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if the trackers extra were not installed
    assert main(["watch", "--out", str(tmp_path / "none"), "--report-to", "wandb", "--", sys.executable, "-c", "pass"]) == 2
    assert "pip install 'rlhf-pitfalls-workbench[trackers]'" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()  # said before the script ran
    pytest.importorskip("trackio")
    from tracker_history import point_trackio_at, trackio_history

    point_trackio_at(tmp_path / "trackio", monkeypatch)
    monkeypatch.setenv("TRACKIO_PROJECT", "watch-cli")
    assert main(["watch", "--out", str(tmp_path / "w"), "--report-to", "trackio", "--", sys.executable, "-c", "pass"]) == 0
    logged = trackio_history("watch-cli", "watch-w")
    report = json.loads((tmp_path / "w" / "report.json").read_text())
    assert sorted(logged) == [0] and logged[0] == Report.from_dict(report).scalars("watch/")
    assert logged[0]["watch/errors"] == 0.0 and "logged the report's counters to trackio" in capsys.readouterr().out
