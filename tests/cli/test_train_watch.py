"""``python -m workbench train … --watch --report-to tensorboard``: the watch's report lands in --output-dir
with the switched-on pitfall, and the TensorBoard event file holds every step's history and the watch's
counters (read back with tensorboard's own EventAccumulator)."""

import json

import pytest

from workbench.cli.main import main

pytest.importorskip("tensorboard")


def test_two_steps_watched_with_tensorboard_scalars(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    code = main(["train", "grpo", "--model", "tiny-gpt2", "--steps", "2", "--output-dir", str(tmp_path), "--quiet",
                 "--watch", "--report-to", "tensorboard", "--set", "position_ids=model"])
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "report.json").read_text())
    assert "S1" in {f["pitfall"] for f in report["findings"] if f["severity"] == "error"}
    assert report["observed"]["optimizer_steps"] == 2 and (tmp_path / "report.html").exists()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/reward", "watch/forwards", "watch/errors", "watch/S1"} <= tags
    assert [e.step for e in events.Scalars("train/loss")] == [0, 1]
    history = json.loads((tmp_path / "history.json").read_text())["history"]
    assert [e.value for e in events.Scalars("train/reward")] == pytest.approx([h["reward"] for h in history], abs=1e-6)
    forwards = [e.value for e in events.Scalars("watch/forwards")]
    assert forwards[0] > 0 and forwards[1] > forwards[0]  # cumulative counters, one point per step


def test_tensorboard_needs_an_output_dir(capsys):
    assert main(["train", "grpo", "--model", "tiny-gpt2", "--steps", "1", "--quiet", "--report-to", "tensorboard"]) == 2
    assert "--output-dir" in capsys.readouterr().err
