"""One writer per output folder: an exclusive lock held on ``<folder>/.lock`` while a training or a catalogue run
writes there.

Why: two processes writing one folder — a training started twice into one ``--output-dir``, ``workbench run --out X
--resume`` while the first run into X still works in another terminal — interleave their checkpoints, histories or
notebook outputs, and nothing says so. The lock is an ``flock``: the operating system releases it when its process ends,
however it ends (``SIGKILL`` included), so no stale lock outlives a killed run and nothing has to be cleaned by hand.
While it is held the file names the holder (pid, host, start), for the message a second writer gets
(``RunFolderInUse``, an ``InputError``: exit code 2 on the command line).

Per thread: a hold nested inside another of the same folder in the same thread is part of it (the command line holds
the folder around a training that holds it again). Another thread of the same process is a second writer like any other
and is refused (``flock`` locks belong to an open file, not to a process), its message saying that the holder is this
process. Where the lock cannot be taken — a file system without ``flock``
(``ENOLCK``/``EOPNOTSUPP`` on some network mounts), a ``.lock`` another user created in a shared folder that this user
may only read (then it is locked read-only, without the holder's line), a platform without ``fcntl`` — the writer goes
on unguarded, with a warning where it can say why.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
import time
from pathlib import Path

from workbench.core.errors import InputError, RunFolderInUse

LOCK = ".lock"
# (resolved folder, process, thread) → how many holds that thread has open on it. The pid: a forked child inherits this
# dict but not the lock's hold (an flock belongs to the open file), so its holds are its own.
_held_here: dict[tuple[str, int, int], int] = {}
UNLOCKABLE = (errno.ENOLCK, errno.EOPNOTSUPP)


@contextlib.contextmanager
def held(folder: str | Path, *, writer: str, collision: str, fix: str):
    """Hold ``folder``'s lock (creating the folder) for the block, or raise ``RunFolderInUse`` (``InputError`` where the
    folder cannot be made, with ``fix``).

    ``writer``: what holds such a folder ("training"); ``collision``: what two of them would do there ("interleave
    their checkpoints and histories"); ``fix``: the way forward besides waiting ("give this one another output folder
    (--output-dir)")."""
    root = Path(folder)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a parent that cannot hold folders (/proc), no permission, a file of that name, a full disk
        raise InputError(f"cannot make the output folder {root}: {error.strerror or error}; {fix}") from error
    key = (str(root.resolve()), os.getpid(), threading.get_ident())
    if key in _held_here:  # this thread holds it already
        _held_here[key] += 1
        try:
            yield
        finally:
            _held_here[key] -= 1
        return
    try:
        import fcntl
    except ImportError:  # no flock on this platform
        yield
        return
    fd, writable = _open(root / LOCK)
    if fd is None:
        print(f"warning: cannot open {root / LOCK} to lock {root}; make sure no other {writer} writes there")
        yield
        return
    acquired = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 500, 0).decode("utf-8", "replace").strip() or "a process that did not say which"
            if any(held_key[:2] == key[:2] for held_key in list(_held_here)):
                holder += ": another thread of this process"
            raise RunFolderInUse(f"{root} is being written by another {writer} ({holder}); two {writer}s in one folder "
                                 f"would {collision}. Wait for it to finish or stop it, or {fix}.") from None
        except OSError as error:
            if error.errno not in UNLOCKABLE:
                raise
            print(f"warning: cannot lock {root} ({error.strerror}); make sure no other {writer} writes there")
        else:
            acquired = True
            if writable:
                os.ftruncate(fd, 0)
                started = time.strftime("%Y-%m-%d %H:%M:%S")
                os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {started}".encode(), 0)
        _held_here[key] = 1
        try:
            yield
        finally:
            del _held_here[key]
    finally:
        if acquired and writable:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # the holder's line goes with the hold; the file stays (unlinking it would race)
        os.close(fd)  # releases the lock


def _open(path: Path) -> tuple[int | None, bool]:
    """``(fd, writable)`` of the lock file: read-write (created if missing), else read-only — ``flock`` takes an
    exclusive lock on either — else ``(None, False)``."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644), True
    except PermissionError:
        try:
            return os.open(path, os.O_RDONLY), False
        except OSError:
            return None, False
