"""``python -m workbench train … --watch --report-to tensorboard trackio wandb``: the watch's report lands in
--output-dir with the switched-on pitfall, and every tracker holds every step's history and the watch's counters, read
back from its own store (TensorBoard's EventAccumulator, trackio's local SQLite store, the W&B offline run file) equal
to the trainer's ``history.json``."""

import json
import math

import pytest
from tracker_history import point_trackio_at, trackio_history, wandb_history

from workbench.cli.main import main

pytest.importorskip("tensorboard")


def test_two_steps_watched_with_every_tracker(tmp_path, capsys, monkeypatch):
    pytest.importorskip("trackio")
    pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    point_trackio_at(tmp_path / "trackio", monkeypatch)
    for variable, value in (("WANDB_SILENT", "true"), ("WANDB_CONSOLE", "off"), ("TRACKIO_PROJECT", "cli"),
                            ("WANDB_PROJECT", "cli")):
        monkeypatch.setenv(variable, value)
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline is the workbench's default
    out = tmp_path / "run"
    code = main(["train", "grpo", "--model", "tiny-gpt2", "--steps", "2", "--output-dir", str(out), "--quiet",
                 "--watch", "--report-to", "tensorboard", "trackio", "wandb", "--set", "position_ids=model"])
    assert code == 0, capsys.readouterr().err
    done = [line for line in capsys.readouterr().out.splitlines() if line.startswith("done: ")]
    assert len(done) == 1 and "nan" not in done[0]  # an undefined value says why instead
    report = json.loads((out / "report.json").read_text())
    assert "S1" in {f["pitfall"] for f in report["findings"] if f["severity"] == "error"}
    assert report["observed"]["optimizer_steps"] == 2 and (out / "report.html").exists()
    history = json.loads((out / "history.json").read_text())["history"]
    trained = [{f"train/{k}": v for k, v in row.items() if isinstance(v, float) and math.isfinite(v)} for row in history]
    undefined = {f"train/{k}" for row in history for k, v in row.items() if isinstance(v, float) and math.isnan(v)}
    assert len(trained) == 2 and "train/loss" in trained[0] and undefined  # e.g. a length mean over no correct row
    assert all(f"{name[6:]}=n/a (" in done[0] for name in undefined if not math.isfinite(history[-1][name[6:]]))

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/reward", "watch/forwards", "watch/errors", "watch/S1"} <= tags
    assert [e.step for e in events.Scalars("train/loss")] == [0, 1]
    assert [e.value for e in events.Scalars("train/reward")] == pytest.approx([h["reward"] for h in history], abs=1e-6)
    forwards = [e.value for e in events.Scalars("watch/forwards")]
    assert forwards[0] > 0 and forwards[1] > forwards[0]  # cumulative counters, one point per step

    for tracked in (trackio_history("cli", "train-grpo-run"), wandb_history(out)):
        assert sorted(tracked) == [0, 1]
        for step, row in enumerate(trained):  # the trainer's history, value for value (float64 in both stores)
            assert {k: tracked[step][k] for k in row} == row
        assert not undefined & {k for row in tracked.values() for k in row}  # an undefined value is not logged as NaN
        assert tracked[1]["watch/forwards"] > tracked[0]["watch/forwards"] > 0 and tracked[1]["watch/S1"] >= 1


def test_tensorboard_needs_an_output_dir(capsys):
    assert main(["train", "grpo", "--model", "tiny-gpt2", "--steps", "1", "--quiet", "--report-to", "tensorboard"]) == 2
    assert "--output-dir" in capsys.readouterr().err
