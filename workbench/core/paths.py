"""Where the repository's files are: its root (notebooks, runs, peer environments) and the ``data/`` folder
(shipped tokenizer, checkpoints, task files); and the temporary folders the workbench makes.

One home for the paths, so that the catalogue, the peers, the task files (``workbench.tasks``) and the models
(``workbench.modeling``) find them without importing each other.

Temporary folders: ``scratch_folder`` for throw-away outputs (removed at exit); ``private_folder`` for a process's
sockets (a catalogue run's kernels, its zygote, a kernel's fork server). A process that is killed (SIGKILL, the
out-of-memory killer, a closed terminal's SIGHUP) removes nothing, so its maker holds an ``flock`` on each private
folder's ``.owner`` file — the system lets it go when the process ends, however it ends — and the next
``private_folder`` of the same kind removes the folders whose lock is free. (A pid check would not do: from another pid
namespace sharing ``/tmp``, a running maker's pid looks ended.)
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "data"


def scratch_folder(prefix: str) -> str:
    """A new temporary folder that is removed when the process exits: for the throw-away output folders and saved
    model copies that TRL trainers and the peer probes need (without it, every test run would leave them in /tmp)."""
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, True)
    return folder


OWNER = ".owner"  # in a private folder: locked (flock) by the process that made it for as long as it lives
_owned: dict[str, int] = {}  # private folder → the descriptor of its locked .owner file, in the process that made it


def private_folder(kind: str, parent: str | None = None) -> str:
    """A new folder ``<parent>/workbench-<kind>-XXXXXXXX`` that only this user may enter (mode 0700), for a process's
    socket files; ``parent`` defaults to the system's temporary folder. This process holds an ``flock`` on the folder's
    ``.owner`` file (its host and pid written there, for a reader) until ``remove_private_folder`` or its end, however
    it ends; the folders of the same ``kind`` there whose lock is free — their maker has ended — are removed first
    (``remove_abandoned``), so a killed run's are not left behind for good."""
    parent = parent or tempfile.gettempdir()
    remove_abandoned(kind, parent)
    folder = tempfile.mkdtemp(prefix=f"workbench-{kind}-", dir=parent)
    # locked under another name, then renamed: a remover never sees an .owner that is not locked yet
    claim = os.path.join(folder, OWNER + ".new")
    fd = os.open(claim, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (ImportError, OSError):  # no flock here: the folder is still made, only never found abandoned
        pass
    os.write(fd, f"{socket.gethostname()} {os.getpid()}".encode())
    os.rename(claim, os.path.join(folder, OWNER))
    _owned[folder] = fd
    return folder


def remove_private_folder(folder: str) -> None:
    """Remove a folder ``private_folder`` made in this process, and let its lock go."""
    shutil.rmtree(folder, ignore_errors=True)
    fd = _owned.pop(folder, None)
    if fd is not None:
        os.close(fd)


def remove_abandoned(kind: str, parent: str) -> list[str]:
    """Remove the ``workbench-<kind>-*`` folders in ``parent`` whose ``.owner`` lock is free: the process that made them
    has ended (the system lets an ``flock`` go with its last descriptor, whatever the pid namespace, however the
    process ended). Return them. A folder without an ``.owner`` (being made now, or made by an older version), one
    whose lock is held, and any where locks do not work are left alone."""
    try:
        import fcntl
    except ImportError:
        return []
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(f"workbench-{kind}-") or entry.path in _owned:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            fd = os.open(os.path.join(entry.path, OWNER), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held (BlockingIOError): its maker runs; or no locks on this file system
            os.close(fd)
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        os.close(fd)
        removed.append(entry.path)
    return removed
