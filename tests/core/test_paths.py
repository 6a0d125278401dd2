"""``core.paths.private_folder``: a 0700 folder naming its owner; the next call of the same kind removes the folders
whose owner has ended (a SIGKILLed run's), and leaves alone those of a running process, of another host, of another
kind and those without an owner's line."""

import os
import socket
import subprocess
import sys
from pathlib import Path

from workbench.core.paths import OWNER, private_folder, remove_abandoned

MAKE_AND_DIE = ("import os, signal, sys\nfrom workbench.core.paths import private_folder\n"
                "print(private_folder('kernel', sys.argv[1]), flush=True)\nos.kill(os.getpid(), signal.SIGKILL)")


def test_a_killed_owners_folder_goes_with_the_next_call_and_the_others_stay(tmp_path):
    killed = subprocess.run([sys.executable, "-c", MAKE_AND_DIE, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9
    abandoned = Path(killed.stdout.strip())
    (abandoned / "kernel-1").write_text("")  # a socket file it left
    assert abandoned.parent == tmp_path and abandoned.name.startswith("workbench-kernel-")
    mine = Path(private_folder("kernel", str(tmp_path)))
    elsewhere = tmp_path / "workbench-kernel-elsewhere"
    elsewhere.mkdir()
    (elsewhere / OWNER).write_text(f"{socket.gethostname()}-other-host 1")
    unowned = tmp_path / "workbench-kernel-older"  # an older version's folder, or one being made now
    unowned.mkdir()
    other_kind = Path(private_folder("zygote", str(tmp_path)))
    (other_kind / OWNER).write_text(f"{socket.gethostname()} {_ended_pid()}")

    assert not abandoned.exists()  # removed by the call that made `mine`
    assert mine.stat().st_mode & 0o777 == 0o700
    assert (mine / OWNER).read_text() == f"{socket.gethostname()} {os.getpid()}"
    newer = Path(private_folder("kernel", str(tmp_path)))
    assert mine.exists() and elsewhere.exists() and unowned.exists() and other_kind.exists() and newer != mine
    assert remove_abandoned("zygote", str(tmp_path)) == [str(other_kind)]


def _ended_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(timeout=60)
    return process.pid
