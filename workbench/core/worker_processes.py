"""Worker processes for parallel training runs: forked from a clean copy of a warm process where one exists, spawned otherwise.

``experiments.comparison.train_variants`` trains its (variant, seed) pairs in worker processes. A spawned worker is a
fresh interpreter that imports torch, transformers and the workbench again before its first step — about 8 CPU-seconds
on this project's 2-core machine, twice per training notebook. Forking the caller instead would skip the imports, but
the caller is usually a notebook kernel that runs threads (ipykernel's channels, torch's pool), and a fork of a threaded
process can inherit a lock held by a thread that does not exist in the child, and hang.

A catalogue kernel is the exception at one moment of its life: it starts as a fork of the runner's zygote
(``catalogue.kernel_fork``) — one thread, the imports done, no torch op run — and only then becomes an ipykernel.
At that moment ``start_fork_server()`` forks a copy of it to be the process's multiprocessing *fork server*: the
standard library's ``multiprocessing.forkserver.main``, the very server that ``get_context("forkserver")`` would
otherwise start by spawning a fresh interpreter. From then on ``context()`` hands out the forkserver context, and
every worker is a fork of that clean, single-threaded copy: no imports to pay, no lock to inherit. Everywhere else (a
JupyterLab kernel, a script, a Python whose fork server this module does not know, ``WORKBENCH_FORK_WORKERS=0``)
``context()`` is the spawn context.

A worker computes the same thing whichever way it starts. It has the kernel's modules (more than a spawned worker
imports; none draws at import) and the same thread setting (the runs set their own); torch's global generator is
untouched in the copy (no op ran), as in a fresh interpreter; Python's and numpy's global generators are re-seeded from
the OS in each worker, as a fresh interpreter's are; ``pool()`` hands each worker the caller's environment as it is at
the call (a fork would see the kernel's at its start). Two differences remain: a forked worker shares the kernel's
string-hash secret (a spawned one draws its own; no result may depend on set order, and none does — results are
reproducible with spawned workers), and ``__main__`` in a worker is an empty module (a function defined in a notebook
cannot be sent to a worker either way). The server's socket is a file in a private folder (mode 0700): the standard
library's server unpickles whatever a client sends, so only this user may reach it. The fork server leaves when its
kernel does (the standard library's "alive" pipe), and dies with it if the kernel is killed (``PR_SET_PDEATHSIG``),
as do its workers. ``tests/core/test_worker_processes.py`` checks where the workers come from; the slow
processes-vs-serial test of ``tests/experiments/test_comparison.py`` and the forked-kernel test of
``tests/catalogue/test_kernel_fork.py`` check their records.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import inspect
import multiprocessing
import os
import random
import signal
import socket
import sys
import time
import types
from concurrent.futures import ProcessPoolExecutor

from workbench.core.paths import private_folder, remove_private_folder

SWITCH_ENV = "WORKBENCH_FORK_WORKERS"  # "0": never start a fork server, spawn every worker
_owner: int | None = None  # the pid of the process whose fork server start_fork_server() started
_server: int | None = None  # that server's pid
_own_folder: str | None = None  # the private folder of its socket, when start_fork_server() made it
# The arguments of multiprocessing.forkserver.main this module knows how to call (Python 3.9–3.13): a newer server
# (3.14 adds an authentication key) is left to the standard library, and the workers are spawned.
KNOWN_SERVER_ARGUMENTS = ["listener_fd", "alive_r", "preload", "main_path", "sys_path"]


def context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context for worker processes: ``forkserver`` when this process started its fork server with
    ``start_fork_server()`` (the workers are forks of a clean copy of it), ``spawn`` otherwise."""
    return multiprocessing.get_context("forkserver" if fork_server() is not None else "spawn")


def fork_server() -> int | None:
    """The pid of the fork server ``start_fork_server()`` started for this process, or None."""
    return _server if _owner == os.getpid() else None


def unsupported() -> str | None:
    """None where ``start_fork_server()`` can work here; otherwise why not."""
    if os.environ.get(SWITCH_ENV, "1") == "0":
        return f"{SWITCH_ENV}=0"
    if not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return f"a fork server needs fork() (Linux); this is {sys.platform}"
    from multiprocessing import forkserver

    arguments = list(inspect.signature(forkserver.main).parameters)
    if arguments != KNOWN_SERVER_ARGUMENTS:
        return f"this Python's multiprocessing.forkserver.main takes {arguments}"
    server = forkserver._forkserver
    if not all(hasattr(server, name) for name in ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid", "_lock")):
        return "this Python's multiprocessing.forkserver keeps its state under other names"
    if server._forkserver_pid is not None:
        return "this process already has a fork server"
    return None


def start_fork_server(folder: str | None = None) -> int | None:
    """Fork this process's multiprocessing fork server now; its pid, or None (the reason is ``unsupported()``, or the
    fork failed: the workers are then spawned).

    Call it only in a process that runs one thread and whose imports are done: every worker will be a fork of the
    copy made here. ``catalogue.kernel_fork`` calls it in each forked kernel before ipykernel starts. The server's
    socket is a file in ``folder`` (the zygote's private folder, removed when the zygote leaves), or in a private
    folder of its own (mode 0700, removed by ``stop_fork_server()`` or at exit): the standard library's server
    unpickles whatever a client sends, so only this user may reach it."""
    global _owner, _server, _own_folder
    if unsupported() is not None:
        return None
    from multiprocessing import forkserver

    own = folder is None
    if own:
        folder = private_folder("fork-server")  # mode 0700; a killed kernel's is removed by the next call
    address = os.path.join(folder, f"fork-server-{os.getpid()}")
    listener = socket.socket(socket.AF_UNIX)
    alive_r = alive_w = -1
    try:
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()  # the workers and this process hold the write end; EOF tells the server to leave
        pid = os.fork()
    except OSError as error:  # no fork (a pids limit, memory) or no socket: spawn the workers, say why
        for fd in (alive_r, alive_w):
            if fd >= 0:
                os.close(fd)
        listener.close()
        if own:
            remove_private_folder(folder)
        else:
            _unlink(address)
        print(f"workbench: no fork server for training workers ({error}); they will be spawned", file=sys.stderr)
        return None
    if pid == 0:  # the server: never returns
        code = 0
        try:
            os.close(alive_w)
            die_with_parent()  # with the kernel (PR_SET_PDEATHSIG)
            os.register_at_fork(after_in_child=_as_a_fresh_worker)
            sys.modules["__main__"] = types.ModuleType("__main__")  # a worker finds no kernel function under __main__
            forkserver.main(listener.fileno(), alive_r, [])  # no preload: the modules are imported already
        except SystemExit:  # the alive pipe reached EOF: every holder has gone
            pass
        except BaseException:  # noqa: BLE001 — a server that fails must still leave through os._exit
            code = 1
        finally:
            os._exit(code)
    listener.close()
    os.close(alive_r)
    server = forkserver._forkserver
    with server._lock:
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid
    _owner, _server, _own_folder = os.getpid(), pid, folder if own else None
    if own:
        atexit.register(remove_private_folder, folder)
    return pid


def pool(max_workers: int) -> ProcessPoolExecutor:
    """A process pool of ``max_workers`` in ``context()``. Forked workers first take this process's environment as it
    is now (a spawned worker inherits it; a fork would see the kernel's at its start)."""
    workers = context()
    if workers.get_start_method() == "forkserver":
        return ProcessPoolExecutor(max_workers, mp_context=workers, initializer=_adopt_environment, initargs=(dict(os.environ),))
    return ProcessPoolExecutor(max_workers, mp_context=workers)


def _adopt_environment(environment: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(environment)


def _as_a_fresh_worker() -> None:
    """In each worker the server forks: die with the server (so with the kernel), and re-seed the global generators
    from the OS, as a fresh interpreter does (Python's own is re-seeded at fork already; numpy's is not)."""
    die_with_parent()
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def die_with_parent() -> None:
    """prctl(PR_SET_PDEATHSIG, SIGKILL): this process dies with its parent (Linux; silently skipped elsewhere)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def stop_fork_server(timeout_s: float = 5.0) -> None:
    """Ask this process's fork server to leave (close the alive pipe) and reap it, killing it after ``timeout_s``
    (a worker still running holds the pipe open). Nothing to do where ``start_fork_server()`` started none."""
    global _owner, _server, _own_folder
    if fork_server() is None:
        return
    from multiprocessing import forkserver

    server = forkserver._forkserver
    pid, folder, _owner, _server, _own_folder = _server, _own_folder, None, None, None
    with server._lock:
        if server._forkserver_pid != pid:  # the standard library found it dead and started its own: that one is the library's
            return
        alive = server._forkserver_alive_fd
        _unlink(server._forkserver_address)
        server._forkserver_address = server._forkserver_alive_fd = server._forkserver_pid = None
    with contextlib.suppress(OSError):
        os.close(alive)
    if folder is not None:
        remove_private_folder(folder)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            return
        time.sleep(0.01)
