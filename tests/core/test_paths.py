"""``core.paths.private_folder``: a 0700 folder whose ``.owner`` file its maker keeps locked; the next call of the same
kind removes the folders whose lock is free (their maker ended, a SIGKILLed run's included) and leaves alone those whose
maker runs — also when the remover lives in another pid namespace, where a pid check would call it ended — those of
another kind and those without an ``.owner``."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.core.paths import OWNER, private_folder, remove_abandoned, remove_private_folder

MAKE_AND_DIE = ("import os, signal, sys\nfrom workbench.core.paths import private_folder\n"
                "print(private_folder('kernel', sys.argv[1]), flush=True)\nos.kill(os.getpid(), signal.SIGKILL)")
REMOVE = "import sys\nfrom workbench.core.paths import remove_abandoned\nprint(remove_abandoned('kernel', sys.argv[1]))"


def test_a_killed_makers_folder_goes_with_the_next_call_and_the_others_stay(tmp_path):
    killed = subprocess.run([sys.executable, "-c", MAKE_AND_DIE, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9
    abandoned = Path(killed.stdout.strip())
    (abandoned / "kernel-1").write_text("")  # a socket file it left
    assert abandoned.parent == tmp_path and abandoned.name.startswith("workbench-kernel-")
    mine = Path(private_folder("kernel", str(tmp_path)))
    assert not abandoned.exists()  # removed by the call that made `mine`
    assert mine.stat().st_mode & 0o777 == 0o700
    assert (mine / OWNER).read_text().endswith(f" {os.getpid()}")  # host and pid, for a reader
    unowned = tmp_path / "workbench-kernel-older"  # an older version's folder, or one being made now
    unowned.mkdir()
    other_kind = Path(private_folder("zygote", str(tmp_path)))
    newer = Path(private_folder("kernel", str(tmp_path)))
    assert mine.exists() and unowned.exists() and other_kind.exists() and newer != mine
    remove_private_folder(str(mine))
    assert not mine.exists()
    remove_private_folder(str(newer))
    remove_private_folder(str(other_kind))


def test_another_process_leaves_a_running_makers_folder_and_removes_it_once_released(tmp_path):
    mine = private_folder("kernel", str(tmp_path))
    other = subprocess.run([sys.executable, "-c", REMOVE, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert other.stdout.strip() == "[]" and os.path.isdir(mine)
    os.close(_release(mine))  # as if this process had ended: its lock goes, the folder stays
    other = subprocess.run([sys.executable, "-c", REMOVE, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert other.stdout.strip() == str([mine]) and not os.path.exists(mine)


@pytest.mark.skipif(shutil.which("unshare") is None or subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                                                                      capture_output=True).returncode != 0,
                    reason="needs unshare --pid (a new pid namespace)")
def test_a_remover_in_another_pid_namespace_leaves_a_running_makers_folder(tmp_path):
    mine = private_folder("kernel", str(tmp_path))
    other = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", REMOVE, str(tmp_path)],
                           capture_output=True, text=True, timeout=120, cwd=os.getcwd())
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == "[]" and os.path.isdir(mine)
    remove_private_folder(mine)


def _release(folder: str) -> int:
    from workbench.core import paths

    return paths._owned.pop(folder)


def test_remove_abandoned_skips_what_it_cannot_read(tmp_path):
    (tmp_path / "workbench-kernel-file").write_text("not a folder")
    assert remove_abandoned("kernel", str(tmp_path)) == []
    assert remove_abandoned("kernel", str(tmp_path / "missing")) == []
