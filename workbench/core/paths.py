"""Where the repository's files are: its root (notebooks, runs, peer environments) and the ``data/`` folder
(shipped tokenizer, checkpoints, task files); and the temporary folders the workbench makes.

One home for the paths, so that the catalogue, the peers, the task files (``workbench.tasks``) and the models
(``workbench.modeling``) find them without importing each other.

Temporary folders: ``scratch_folder`` for throw-away outputs (removed at exit); ``private_folder`` for a process's
sockets (a catalogue run's kernels, its zygote, a kernel's fork server). A process that is killed (SIGKILL, the
out-of-memory killer, a closed terminal's SIGHUP) removes nothing, so each private folder names its owner (host and pid
in a ``.owner`` file) and the next ``private_folder`` of the same kind removes those whose owner has ended.
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
    model copies that TRL trainers and the peer probes need (without it, every test run left them in /tmp)."""
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, True)
    return folder


OWNER = ".owner"  # in a private folder: "<host> <pid>" of the process that made it


def private_folder(kind: str, parent: str | None = None) -> str:
    """A new folder ``<parent>/workbench-<kind>-XXXXXXXX`` that only this user may enter (mode 0700), for a process's
    socket files; ``parent`` defaults to the system's temporary folder. Its owner (this host and process) is written in
    it, and the folders of the same ``kind`` there whose owner has ended are removed first (``remove_abandoned``): a
    killed run's are not left behind for good. The caller still removes its own folder when it is done."""
    parent = parent or tempfile.gettempdir()
    remove_abandoned(kind, parent)
    folder = tempfile.mkdtemp(prefix=f"workbench-{kind}-", dir=parent)
    Path(folder, OWNER).write_text(f"{socket.gethostname()} {os.getpid()}")
    return folder


def remove_abandoned(kind: str, parent: str) -> list[str]:
    """Remove the ``workbench-<kind>-*`` folders in ``parent`` that this user owns and whose ``.owner`` names this host
    and a process that no longer runs; return them. A folder without a readable owner (being made now, or made by an
    older version) is left alone, as is one whose owner runs — or might: another host's, or a pid now in use again."""
    host, removed = socket.gethostname(), []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(f"workbench-{kind}-"):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            owner_host, pid = Path(entry.path, OWNER).read_text().split()
            pid = int(pid)
        except (OSError, ValueError):
            continue
        if owner_host == host and not _running(pid):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's process runs under that pid
        return True
    return True
