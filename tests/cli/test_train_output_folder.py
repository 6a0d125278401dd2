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


def test_an_output_folder_that_cannot_be_made_exits_2_naming_it_and_the_option(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main([*ARGS, "--output-dir", str(blocker / "run")]) == 2  # not a traceback and exit 1 (NotADirectoryError)
    err = capsys.readouterr().err
    assert f"cannot make the output folder {blocker / 'run'}: Not a directory" in err and "--output-dir" in err


EXIT = ("import sys\nfrom workbench.trainers.distributed import Distributed\n"
        "print('refused', end='')\nsys.stderr.write('error: held')\nDistributed.exit_launched(2)\nprint('teardown reached')")


def test_a_launched_rank_leaves_on_its_error_with_the_code_and_its_words_but_without_the_teardown():
    """Under a launcher (WORLD_SIZE > 1) a rank's pre-training error ends the process at once, streams flushed: torch's
    C++ teardown at exit can turn such an exit 2 into a SIGABRT root cause. In one process nothing changes."""
    import os
    import subprocess
    import sys

    launched = subprocess.run([sys.executable, "-c", EXIT], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "WORLD_SIZE": "2"})
    assert (launched.returncode, launched.stdout, launched.stderr) == (2, "refused", "error: held")
    alone = subprocess.run([sys.executable, "-c", EXIT], capture_output=True, text=True, timeout=120,
                           env={k: v for k, v in os.environ.items() if k != "WORLD_SIZE"})
    assert (alone.returncode, alone.stdout) == (0, "refusedteardown reached\n")


def test_a_dump_folder_that_cannot_be_made_exits_2_before_the_model_loads(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main([*ARGS, "--dump-rollouts", str(blocker)]) == 2
    assert "--dump-rollouts" in capsys.readouterr().err
    assert main([*ARGS, "--dump-rollouts", str(blocker / "below")]) == 2
    err = capsys.readouterr().err
    assert f"--dump-rollouts {blocker / 'below'}: the folder cannot be made (Not a directory)" in err
    assert main([*ARGS, "--dump-rollouts", str(tmp_path / "dump"), "--dump-format", "csv"]) == 2  # the config refuses the format
