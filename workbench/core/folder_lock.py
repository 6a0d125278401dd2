"""One writer per output folder: an exclusive lock held on ``<folder>/.lock`` while a training or a catalogue run
writes there.

Why: two processes writing one folder — a training started twice into one ``--output-dir``, ``workbench run --out X
--resume`` while the first run into X still works in another terminal — interleave their checkpoints, histories or
notebook outputs, and nothing says so. The lock is an ``flock``: the operating system releases it when its process ends,
however it ends (``SIGKILL`` included), so no stale lock outlives a killed run and nothing has to be cleaned by hand.
The file holds the holder's pid, host and start while it is held, for the message a second writer gets
(``RunFolderInUse``, an ``InputError``: exit code 2 on the command line). Where the file system cannot lock (``ENOLCK``
on some network mounts) the writer goes on unguarded with a warning; where the platform has no ``fcntl``, silently.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

from workbench.core.errors import RunFolderInUse

LOCK = ".lock"


@contextlib.contextmanager
def held(folder: str | Path, *, writer: str, collision: str, fix: str):
    """Hold ``folder``'s lock (creating the folder) for the block, or raise ``RunFolderInUse``.

    ``writer``: what holds such a folder ("training"); ``collision``: what two of them would do there ("interleave
    their checkpoints and histories"); ``fix``: the way forward besides waiting ("give this one another output folder
    (--output-dir)")."""
    try:
        import fcntl
    except ImportError:  # no flock on this platform
        yield
        return
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 500, 0).decode("utf-8", "replace").strip() or "a process that did not say which"
            raise RunFolderInUse(f"{root} is being written by another {writer} ({holder}); two {writer}s in one folder "
                                 f"would {collision}. Wait for it to finish or stop it, or {fix}.") from None
        except OSError as error:
            print(f"warning: cannot lock {root} ({error.strerror}); make sure no other {writer} writes there")
        else:
            os.ftruncate(fd, 0)
            started = time.strftime("%Y-%m-%d %H:%M:%S")
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {started}".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # the holder's line goes with the hold; the file stays (unlinking it would race)
        os.close(fd)  # releases the lock
