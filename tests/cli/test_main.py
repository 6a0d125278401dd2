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


def test_a_reader_that_leaves_early_gets_no_traceback():
    """``python -m workbench list | head -1``: the listing stops when the pipe closes, quietly (exit 1, as Python's
    documentation advises for a broken pipe), instead of a BrokenPipeError traceback. The reader here is gone before
    the first write (a race-free stand-in for ``head`` leaving after one line)."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)
    try:
        listing = subprocess.run([sys.executable, "-m", "workbench", "list"], stdout=write, capture_output=False,
                                 stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(write)
    stderr = listing.stderr.decode()
    assert listing.returncode == 1, (listing.returncode, stderr)
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
