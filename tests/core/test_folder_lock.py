"""``core.folder_lock``: one writer per output folder — a second is refused naming the holder and the fix, the lock
goes with its holder however the holder ends (SIGKILL included), and the holder's line goes with the hold."""

import os
import signal
import subprocess
import sys

import pytest

from workbench.core.errors import InputError, RunFolderInUse
from workbench.core.folder_lock import LOCK, held

WORDS = {"writer": "run", "collision": "collide", "fix": "pick another folder"}


def test_a_second_writer_is_refused_naming_the_holder_and_the_fix(tmp_path):
    with held(tmp_path, **WORDS):
        with pytest.raises(RunFolderInUse, match=rf"{tmp_path} is being written by another run \(pid {os.getpid()} on .+, since "
                                                 r".+\); two runs in one folder would collide\. .*pick another folder\."):
            with held(tmp_path, **WORDS):
                pass
    with held(tmp_path, **WORDS):  # released with its hold: taken again
        pass
    assert issubclass(RunFolderInUse, InputError)  # exit code 2 on the command line
    assert (tmp_path / LOCK).read_text() == ""  # no holder's line once free


def test_a_missing_folder_is_created_and_held(tmp_path):
    with held(tmp_path / "a" / "b", **WORDS):
        assert (tmp_path / "a" / "b" / LOCK).read_text().startswith(f"pid {os.getpid()} on ")


def test_the_lock_goes_with_a_killed_holder(tmp_path):
    code = ("import sys, time\nfrom workbench.core.folder_lock import held\n"
            "with held(sys.argv[1], writer='run', collision='collide', fix='wait'):\n    print('held', flush=True)\n    time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderInUse, match=rf"\(pid {holder.pid} on "):
            with held(tmp_path, **WORDS):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    with held(tmp_path, **WORDS):  # no stale lock after a SIGKILL
        pass
