"""``workbench train --output-dir``: a folder another training is writing to is an exit-2 error that names the holder
and the fix, with nothing trained there; once it is free, the same command trains."""

import json

from workbench.cli.main import main

ARGS = ["train", "grpo", "--limit", "4", "--quiet", "--set", "steps=1", "--set", "prompts_per_step=2",
        "--set", "num_generations=2"]


def test_a_folder_another_training_holds_exits_2_and_trains_nothing(tmp_path, capsys, hold_elsewhere):
    out = tmp_path / "run"
    with hold_elsewhere(out):
        assert main([*ARGS, "--output-dir", str(out), "--report-to", "tensorboard"]) == 2
    err = capsys.readouterr().err
    assert "is being written by another training (pid " in err and "--output-dir" in err
    assert sorted(p.name for p in out.iterdir()) == [".lock"]  # no checkpoint, history or TensorBoard file
    assert main([*ARGS, "--output-dir", str(out)]) == 0
    assert len(json.loads((out / "history.json").read_text())["history"]) == 1
