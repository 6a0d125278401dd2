"""``python -m workbench``: the sub-commands, each importing only its own module."""

import subprocess
import sys
from pathlib import Path

import pytest

from workbench.cli.main import SUBCOMMANDS, main

REPO = Path(__file__).resolve().parents[2]


def test_help_lists_every_sub_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    printed = capsys.readouterr().out
    for name in ("list", "run", *SUBCOMMANDS):
        assert name in printed
    for _, help_text in SUBCOMMANDS.values():
        assert help_text.split()[0] in printed


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_a_sub_command_gets_its_own_arguments(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0
    assert f"usage: python -m workbench {name}" in capsys.readouterr().out


def test_a_sub_command_process_does_not_import_the_notebook_readers():
    """``audit`` (like train, grade and watch) does not read notebooks: no nbformat, whose jsonschema costs ~2 s of
    imports in every process that loads it."""
    script = ("import sys\nfrom workbench.cli.main import main\n"
              "code = main(['audit', 'examples/buggy_trainers.py:grpo_loss', '--check', 'position_ids'])\n"
              "print(code, sorted(m for m in ('nbformat', 'jsonschema', 'papermill') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert done.stdout.split("\n")[-2] == "2 []", done.stdout + done.stderr
    assert "pass --model" in done.stderr


STUB = ("import sys; import workbench.catalogue.listing as listing; everything = listing.catalogue; "
        "listing.catalogue = lambda: everything()[:{n}]; from workbench.cli.main import main; sys.exit(main(['list']))")


@pytest.mark.parametrize("notebooks", [2, 1000])  # a listing shorter than a pipe's buffer, and the whole catalogue
def test_a_reader_that_leaves_early_gets_no_traceback(notebooks):
    """``python -m workbench list | head -1``: the listing stops when the pipe closes, quietly, with exit 141 (as a
    shell reports a writer stopped by SIGPIPE) — also when the whole listing fits the output buffer and the failing
    write would otherwise be the interpreter's flush at exit. The reader is gone before the first write (a race-free
    stand-in for ``head``), and stdout is block-buffered as in a real pipe."""
    import os
    import subprocess
    import sys

    from workbench.cli.main import READER_LEFT

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    read, write = os.pipe()
    os.close(read)
    try:
        listing = subprocess.run([sys.executable, "-c", STUB.format(n=notebooks)], stdout=write, stderr=subprocess.PIPE,
                                 env=env, timeout=60)
    finally:
        os.close(write)
    stderr = listing.stderr.decode()
    assert listing.returncode == READER_LEFT == 141, (listing.returncode, stderr)
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr and "Exception ignored" not in stderr, stderr


@pytest.mark.parametrize("argv, words", [(["run", "00_quickstart", "-j", "0"], "argument -j/--jobs: must be ≥ 1; got 0"),
                                         (["train", "grpo", "--limit", "x"], "argument --limit: expects an int ≥ 1; got 'x'"),
                                         (["train", "grpo", "--limit", "0"], "argument --limit: must be ≥ 1; got 0")])
def test_a_count_below_one_is_refused_by_name(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_:  # not -j 0 run as -j 1, nor --limit 0 taking every row
        main(argv)
    assert exit_.value.code == 2 and words in capsys.readouterr().err


def test_the_done_line_says_why_a_value_is_undefined_never_nan():
    from workbench.cli.train import done_line

    line = done_line({"step": 3, "loss": 0.25, "ratio_deviation_later": float("nan"), "length_correct": float("nan"),
                      "other": float("nan")})
    assert line == ("done: loss=0.25, ratio_deviation_later=n/a (one optimisation step per rollout batch: no later step), "
                    "length_correct=n/a (no correct response in the last batch), other=n/a (not measured)")
