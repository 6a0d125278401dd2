"""Docs that run: the code blocks of README.md, CONTRIBUTING.md and docs/*.md are executed or say why not.

The convention (CONTRIBUTING.md, "Docs that run"): an HTML comment on the line before a fenced block marks it.

- ``<!-- runnable -->`` before a ``bash`` block: every command line of it is executed by ``test_runnable_block_runs``
  (slow), from the repository root, in smoke mode; ``<!-- runnable: 2 3 -->`` executes only those lines of the block
  (1-based; the others need files of your own). A trailing ``# exit N`` comment is the exit status the line must give
  (0 otherwise).
- ``<!-- illustrative: <why> -->`` before a ``python`` block that cannot run as written (it stands for your code).
- ``<!-- <name> (tests/<path> runs this block) -->``: another test executes it; the test file must name ``<name>``.

Every ``python`` block carries one of these marks (checked in the default suite). Smoke mode rewrites each executed
line the way a reader's run would be shortened: ``.venv/bin/<tool>`` and ``python`` are this interpreter's
environment (also the ``python`` a ``watch`` runs), ``runs/…`` folders go to a temporary folder (one per page, so a
page's later block resumes an earlier block's run), ``train`` runs 1 step, ``run`` gets ``--smoke`` and
``run``/``watch`` an ``--out`` folder when none is given.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REFERENCE_PAGES

from workbench.core.paths import REPO_ROOT

MARK = re.compile(r"^<!--\s*(.*?)\s*-->$")
FENCE = re.compile(r"^```(\S*)(.*)$")
EXIT = re.compile(r"#\s*exit (\d+)")
TESTED_ELSEWHERE = re.compile(r"^(\S+) \((tests/\S+\.py) runs this block\)$")


@dataclass
class Block:
    page: Path
    line: int  # the fence's line, 1-based
    language: str
    mark: str | None  # the HTML comment's text on the line before the fence
    lines: list[str]

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO_ROOT)}:{self.line}"

    def runnable_lines(self) -> list[int]:
        """The 1-based lines a ``runnable`` mark selects (all of them when it names none)."""
        words = self.mark.split(":", 1)
        if len(words) == 1 or not words[1].strip():
            return [n for n, text in enumerate(self.lines, 1) if text.strip() and not text.lstrip().startswith("#")]
        return [int(word) for word in words[1].split()]


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a markdown page, each with the mark on the line before it."""
    found, lines, index = [], page.read_text().splitlines(), 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if fence:
            end = index + 1
            while not lines[end].startswith("```"):
                end += 1
            previous = lines[index - 1].strip() if index else ""
            mark = MARK.match(previous)
            found.append(Block(page, index + 1, fence.group(1), mark.group(1) if mark else None, lines[index + 1:end]))
            index = end
        index += 1
    return found


ALL_BLOCKS = [block for page in REFERENCE_PAGES if page.suffix == ".md" for block in blocks(page)]
RUNNABLE = [block for block in ALL_BLOCKS if block.mark and block.mark.split(":")[0] == "runnable"]


def test_every_python_block_is_run_or_marked_illustrative():
    python = [block for block in ALL_BLOCKS if block.language == "python"]
    assert python
    for block in python:
        assert block.mark, f"{block.name}: a python block needs <!-- runnable -->, <!-- illustrative: why --> or the test that runs it"
        tested = TESTED_ELSEWHERE.match(block.mark)
        if tested:
            assert tested.group(1) in (REPO_ROOT / tested.group(2)).read_text(), f"{block.name}: {tested.group(2)} never names it"
        else:
            kind = block.mark.split(":")[0]
            assert kind in ("runnable", "illustrative"), f"{block.name}: unknown mark {block.mark!r}"
            assert kind == "runnable" or block.mark.split(":", 1)[1].strip(), f"{block.name}: say why it is illustrative"


def test_runnable_marks_name_command_lines_of_a_bash_block():
    assert RUNNABLE
    for block in RUNNABLE:
        assert block.language in ("bash", "python"), f"{block.name}: runnable, but a {block.language or 'plain'} block"
        for number in block.runnable_lines():
            assert 1 <= number <= len(block.lines), f"{block.name}: line {number} of a {len(block.lines)}-line block"
            text = block.lines[number - 1].strip()
            assert text and not text.startswith("#") and not text.endswith("\\"), f"{block.name}: line {number} is {text!r}"


def smoke_command(line: str, scratch: Path) -> tuple[list[str], int]:
    """A documented command line as the test runs it (module doc), and the exit status it must give."""
    expected = EXIT.search(line)
    args = shlex.split(line, comments=True)
    args = [sys.executable if arg in ("python", ".venv/bin/python") else arg for arg in args]
    if args[0].startswith(".venv/bin/"):
        args[0] = str(Path(sys.executable).parent / args[0].removeprefix(".venv/bin/"))
    args = [str(scratch / arg) if arg.startswith("runs/") else arg for arg in args]
    if args[1:3] == ["-m", "workbench"] and len(args) > 3:
        command = args[3]
        if command == "train" and "--steps" in args:
            args[args.index("--steps") + 1] = "1"
        if command == "run" and "--smoke" not in args:
            args.append("--smoke")
        if command in ("run", "watch") and "--out" not in args:
            args[4:4] = ["--out", str(scratch / f"{command}-{zlib.crc32(line.encode()):08x}")]
    return args, int(expected.group(1)) if expected else 0


@pytest.fixture(scope="module")
def scratch_by_page(tmp_path_factory):
    return {}


@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=lambda block: block.name)
def test_runnable_block_runs(block, scratch_by_page, tmp_path_factory):
    scratch = scratch_by_page.setdefault(block.page, tmp_path_factory.mktemp(block.page.stem))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    for number in block.runnable_lines():
        line = block.lines[number - 1]
        args, expected = smoke_command(line, scratch)
        done = subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == expected, (f"{block.name} line {number}: {line}\nran: {shlex.join(args)}\nexit "
                                             f"{done.returncode}, not {expected}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
