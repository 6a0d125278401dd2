"""Notebook kernels forked from a warm process: the catalogue's imports paid once per run, not once per notebook.

A fresh Jupyter kernel spends about 2.5 CPU-seconds importing torch, transformers, matplotlib and the
workbench before a notebook's first line does any work; over the 38 notebooks of the smoke catalogue that
is a third of its CPU time. ``run_catalogue`` therefore starts one *zygote* (``python -m
workbench.catalogue.kernel_fork serve SOCKET``) that imports those modules once, runs no torch op and
starts no thread, then forks one child per notebook kernel. The child takes the launching process's
stdio, working folder and environment, re-seeds Python's and numpy's global generators from the OS (as a
new process would), applies the thread count the runner chose, and becomes an ordinary ipykernel — the
notebook cannot tell the difference (``tests/catalogue/test_kernel_fork.py`` compares a forked run's
metrics with a fresh kernel's).

Jupyter launches kernels as processes it can signal and wait for, so the kernel command becomes a small
*client* (``python -m workbench.catalogue.kernel_fork launch SOCKET -f CONNECTION_FILE``; stdlib only,
~20 ms): it hands its stdio to the zygote over a Unix socket (``SCM_RIGHTS``), relays SIGINT/SIGTERM to
the forked kernel, and exits with the kernel's exit code. If the client dies (SIGKILL), the zygote kills
the kernel; if the runner dies, the zygote kills its kernels and exits.

Where forking is unsafe or impossible the client execs an ordinary kernel instead, and says why on stderr:
no zygote socket, a platform without ``fork`` or ``SOCK_SEQPACKET`` Unix sockets (Linux has both), or a
zygote that finds a thread in itself beyond OpenBLAS's pools (a fork of a threaded process can inherit a held
lock — the reason the batch runner spawns its own workers; OpenBLAS, loaded by numpy and, where scipy is
installed, once more by scipy, shuts its pool down at fork through ``pthread_atfork``, so those threads are
allowed). ``WORKBENCH_FORK_KERNELS=0`` turns the zygote off.

Each forked kernel, while it still runs one thread, forks a copy of itself to serve as its multiprocessing fork
server (``core.worker_processes``): the training workers of ``train_variants`` are forks of that copy, with the imports
already done, instead of fresh interpreters. At a shutdown request the kernel stops and reaps that server itself
(``catalogue_kernel``: else ipykernel waits on it until the kernel is killed); a server that outlives a killed kernel
is reaped here — the zygote is a child subreaper (``PR_SET_CHILD_SUBREAPER``) — rather than left a zombie of init,
and its CPU time counts in the runner's.

The zygote is started with the thread settings the runner gives its kernels (``OMP_NUM_THREADS``,
``MKL_NUM_THREADS``), so libraries that read them when imported (numpy's OpenBLAS) see what an ordinary
kernel would. Its socket is a file in a private folder (mode 0700, made by the runner, removed after the zygote
leaves): the kernel forked for a request runs as this user, so only this user may send one (a socket in Linux's
abstract namespace would be open to every local user). The kernels' fork-server sockets are files in the same
folder. The inline figure backend and ipywidgets are *not* preloaded: they hook into IPython when first
imported, which only works inside the kernel.

The module imports only the standard library at the top: the client must start in milliseconds. The
zygote's heavy imports are in ``PRELOAD`` and happen inside ``serve``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import json
import os
import pkgutil
import random
import select
import signal
import socket
import subprocess
import sys
import time
import traceback

SOCKET_ENV = "WORKBENCH_KERNEL_ZYGOTE"
SWITCH_ENV = "WORKBENCH_FORK_KERNELS"
# What the catalogue's notebooks import before their first computation. A module that fails to import here
# is simply imported by the kernel itself; none of them draws, seeds or starts a thread at import.
PRELOAD = (
    "numpy", "torch", "transformers", "safetensors.torch", "matplotlib.pyplot",
    "IPython", "ipykernel.kernelapp", "ipykernel.ipkernel",
    "transformers.models.qwen2.modeling_qwen2", "transformers.models.llama.modeling_llama",
    "transformers.models.gpt2.modeling_gpt2", "transformers.models.gemma2.modeling_gemma2",
    "transformers.models.auto.tokenization_auto", "transformers.tokenization_utils_tokenizers",  # imported by the first load()
    "workbench.catalogue.notebook_api", "workbench.experiments.checkpoints", "workbench.experiments.comparison",
    "workbench.experiments.statistics", "workbench.modeling.models", "workbench.viz.plots", "workbench.pitfalls",
    "workbench.catalogue.catalogue_kernel",
)
# The kernel class a forked kernel runs (ipykernel's IPKernelApp.kernel_class): IPython's, whose shutdown first stops
# the kernel's fork server for training workers (else ipykernel waits on it until jupyter_client kills the kernel)
KERNEL_CLASS = "workbench.catalogue.catalogue_kernel.CatalogueKernel"
# Modules that start an OpenBLAS thread pool when imported: numpy's, and scipy's own copy of OpenBLAS (scipy-openblas),
# which transformers' imports load where scipy is installed (the GPU image: docs/journal/2026-11-27.md, fifth lease).
# Their pools are the zygote's only allowed threads.
BLAS_POOLS = ("numpy", "scipy.linalg")
MESSAGE_BYTES = 1 << 20  # one request: the kernel's arguments, folder and environment
CONNECT_SECONDS = 30.0  # a client may start before the zygote has bound its socket
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
_private_folder: str | None = None  # the zygote's folder for its kernels' fork-server sockets (removed when it leaves)
_wakeup: tuple[int, int] | None = None  # the zygote's SIGCHLD pipe (read end, write end)


def supported() -> str | None:
    """None where kernels can be forked here; otherwise the reason they cannot."""
    if os.environ.get(SWITCH_ENV, "1") == "0":
        return f"{SWITCH_ENV}=0"
    if not hasattr(os, "fork") or not hasattr(socket, "SOCK_SEQPACKET") or not sys.platform.startswith("linux"):
        return f"forking kernels needs fork() and SOCK_SEQPACKET Unix sockets (Linux); this is {sys.platform}"
    return None


# ---- the runner's side ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def zygote(enabled: bool = True, threads: int | None = None):
    """Run a zygote for the duration of the block and point ``SOCKET_ENV`` at it (restored after); does
    nothing where ``supported()`` gives a reason or ``enabled`` is False. ``threads``: the thread count the
    runner gives each kernel (``OMP_NUM_THREADS``/``MKL_NUM_THREADS``), None when it sets none."""
    if not enabled or supported() is not None:
        yield None
        return

    from workbench.core.paths import private_folder, remove_private_folder

    # a socket file in a private folder (mode 0700): a request names a connection file, folder and environment, and the
    # kernel forked for it runs as this user — only this user may send one (an abstract socket is open to every user)
    folder = private_folder("zygote")  # (a SIGKILLed run's is removed by the next run's call)
    if len(folder) > 90:  # a Unix socket path holds 107 bytes: a long TMPDIR falls back to /tmp
        remove_private_folder(folder)
        folder = private_folder("zygote", "/tmp")
    name = os.path.join(folder, "zygote.sock")
    env = {**os.environ, **({v: str(threads) for v in THREAD_VARIABLES} if threads is not None else {})}
    process = subprocess.Popen([sys.executable, "-m", "workbench.catalogue.kernel_fork", "serve", name],
                               stdin=subprocess.DEVNULL, env=env)
    previous = os.environ.get(SOCKET_ENV)
    os.environ[SOCKET_ENV] = name
    try:
        yield name
    finally:
        if previous is None:
            os.environ.pop(SOCKET_ENV, None)
        else:
            os.environ[SOCKET_ENV] = previous
        process.terminate()  # serve's SIGTERM handler kills its kernels first
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        remove_private_folder(folder)


def kernel_command(cmd: list[str]) -> list[str]:
    """The kernel command line with ``-m ipykernel_launcher`` replaced by the client when a zygote runs."""
    path = os.environ.get(SOCKET_ENV)
    if not path or supported() is not None or cmd[1:3] != ["-m", "ipykernel_launcher"] or not _same_interpreter(cmd[0]):
        return cmd
    return [cmd[0], "-m", "workbench.catalogue.kernel_fork", "launch", path, *cmd[3:]]


def _same_interpreter(executable: str) -> bool:
    """Only kernels of this interpreter are forked: a kernelspec naming another Python gets that Python."""
    try:
        return os.path.samefile(executable, sys.executable)
    except OSError:
        return False


# ---- the zygote ----------------------------------------------------------------------------------------------------
def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _allowed_threads() -> int:
    """This process's threads once the ``BLAS_POOLS`` modules are imported: itself and their OpenBLAS pools, which
    OpenBLAS stops at every fork (``pthread_atfork``; tests/catalogue/test_kernel_fork.py forks and counts)."""
    for name in BLAS_POOLS:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    return _threads()


def serve(path: str) -> None:
    """Listen on ``path`` at once, import ``PRELOAD``, then fork a kernel per request until the parent exits
    or the zygote is terminated; its kernels are killed on the way out."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the runner, which terminates the zygote
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so that the finally below kills the kernels
    _become_subreaper()
    import shutil

    global _private_folder
    parent = os.getppid()
    _private_folder = os.path.dirname(path)  # the runner's private folder: the kernels' fork-server sockets go beside this one
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)  # clients may connect now; they wait for their reply while the imports run
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")  # what ipykernel would set
    allowed = _allowed_threads()
    preload()
    kernels: dict[socket.socket, int] = {}  # a client's connection → its kernel
    orphans: set[int] = set()  # kernels whose client died: killed, waiting to be reaped
    global _wakeup
    _wakeup = os.pipe()  # a kernel's exit wakes the loop at once (SIGCHLD → this pipe), not at the next 0.5 s poll
    for fd in _wakeup:
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(_wakeup[1])
    signal.signal(signal.SIGCHLD, lambda *_: None)
    try:
        while os.getppid() == parent:
            ready, _, _ = select.select([listener, _wakeup[0], *kernels], [], [], 0.5)
            for sock in ready:
                if sock == _wakeup[0]:
                    with contextlib.suppress(BlockingIOError):
                        os.read(_wakeup[0], 4096)
                elif sock is listener:
                    _accept(listener, kernels, orphans, allowed)
                elif not _recv_or_empty(sock):  # the client died: its kernel goes too
                    pid = kernels.pop(sock)
                    sock.close()
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                    orphans.add(pid)
            _reap(kernels, orphans)
    finally:
        for pid in [*kernels.values(), *orphans]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        shutil.rmtree(_private_folder, ignore_errors=True)


def preload() -> None:
    """Import ``PRELOAD`` and every pitfall module, skipping any that fails (the kernel then imports it itself)."""
    for name in PRELOAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    if "workbench.pitfalls" in sys.modules:
        for module in pkgutil.iter_modules(sys.modules["workbench.pitfalls"].__path__):
            with contextlib.suppress(Exception):
                importlib.import_module(f"workbench.pitfalls.{module.name}")


def _accept(listener: socket.socket, kernels: dict, orphans: set, allowed: int) -> None:
    """One request: fork its kernel and reply ``pid N``, or ``nofork REASON``. A client that vanishes on the
    way costs only its own request."""
    conn, _ = listener.accept()
    fds: list[int] = []
    pid = None
    try:
        conn.settimeout(10)
        message, fds, _, _ = socket.recv_fds(conn, MESSAGE_BYTES, 3)
        request = json.loads(message)
        threads = _threads()
        if threads > allowed or len(fds) != 3:
            conn.send(f"nofork the zygote runs {threads} threads, {allowed} expected (a fork could inherit a held lock)".encode())
            conn.close()
            return
        pid = os.fork()
        if pid == 0:  # the kernel: never returns
            listener.close()
            for other in kernels:
                other.close()
            conn.close()
            _become_kernel(request, fds)
        conn.settimeout(None)
        conn.send(f"pid {pid}".encode())
        kernels[conn] = pid
    except (OSError, ValueError):  # the client died or sent garbage: drop it, kill its kernel if one was forked
        conn.close()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            orphans.add(pid)
    finally:
        for fd in fds:
            os.close(fd)


def _recv_or_empty(sock: socket.socket) -> bytes:
    try:
        return sock.recv(64)
    except OSError:
        return b""


def _reap(kernels: dict, orphans: set) -> None:
    """Reap every exited child: kernels (their clients get the exit code), and the descendants orphaned to this
    subreaper (a kernel's fork server and workers when the kernel left first)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        orphans.discard(pid)
        for conn, child in list(kernels.items()):
            if child == pid:
                with contextlib.suppress(OSError):
                    conn.send(f"exit {os.waitstatus_to_exitcode(status)}".encode())
                conn.close()
                del kernels[conn]


def _become_kernel(request: dict, fds: list[int]) -> None:
    code = 1
    try:
        os.setsid()  # like a kernel jupyter_client starts: its own session, out of reach of the runner's Ctrl-C
        from workbench.core.worker_processes import die_with_parent  # imported by the zygote's preload

        die_with_parent()  # a zygote killed outright (SIGKILL) takes its kernels with it
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        for fd in _wakeup or ():
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # ``python -m ipykernel_launcher`` drops its own folder from sys.path (IPython adds '' back); the zygote's is ours
        if sys.path and not sys.flags.safe_path:
            del sys.path[0]
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        if _threads() == 1 and "workbench.core.worker_processes" in sys.modules:  # one thread still (a fork child): training
            # workers fork from a copy of this, made before set_num_threads (torch's pool) and ipykernel start threads
            try:
                sys.modules["workbench.core.worker_processes"].start_fork_server(_private_folder)
            except Exception:  # noqa: BLE001 — the kernel still runs; its workers are spawned
                traceback.print_exc()
        threads = os.environ.get("OMP_NUM_THREADS")
        if threads and threads.isdigit() and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(int(threads))
        # ipykernel reads JPY_PARENT_PID into a trait default when it is imported, i.e. in the zygote: say it again (it keeps
        # the kernel's start-up banner quiet; its parent poller cannot watch the launcher here, the client does that)
        parent = os.environ.get("JPY_PARENT_PID", "")
        sys.argv = ["ipykernel_launcher", *request["argv"], *([f"--IPKernelApp.parent_handle={parent}"] if parent.isdigit() else []),
                    f"--IPKernelApp.kernel_class={KERNEL_CLASS}"]  # its shutdown stops the fork server first (catalogue_kernel)
        from ipykernel import kernelapp  # already imported by the zygote

        kernelapp.launch_new_instance()
        code = 0
        atexit._run_exitfuncs()  # the exit handlers an ordinary interpreter would run (IPython's history, temp files)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 — a kernel that fails must still leave through os._exit
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        with contextlib.suppress(Exception):
            sys.modules["workbench.core.worker_processes"].stop_fork_server()
        os._exit(code)


def _become_subreaper() -> None:
    """prctl(PR_SET_CHILD_SUBREAPER): a kernel's descendants that outlive it (its fork server for training workers,
    killed with it) become this process's children, reaped here, rather than init's: no zombies, and their CPU time
    counted in the runner's (Linux; silently skipped elsewhere)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1)  # 36 = PR_SET_CHILD_SUBREAPER


# ---- the client ----------------------------------------------------------------------------------------------------
def launch(path: str, argv: list[str]) -> int:
    """Ask the zygote at ``path`` for a kernel with ``argv``; wait for it and return its exit code. Falls back
    to exec'ing an ordinary kernel when no fork can be had."""
    reason = supported()
    if reason is None:
        try:
            conn = _connect(path)
            request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}
            socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
            reply = conn.recv(256).decode()
        except OSError as exc:
            reply = f"nofork the zygote at {path} could not be asked ({exc})"
        if reply.startswith("pid "):
            return _relay(conn, int(reply.split()[1]))
        reason = reply.removeprefix("nofork ") or "the zygote closed the connection"
    print(f"workbench: starting an ordinary kernel ({reason})", file=sys.stderr)
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *argv])
    return 1  # not reached


def _connect(path: str) -> socket.socket:
    """Connect, retrying while the zygote starts (its socket does not exist yet) for up to ``CONNECT_SECONDS``."""
    deadline = time.monotonic() + CONNECT_SECONDS
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(path)
            return conn
        except (ConnectionRefusedError, FileNotFoundError):
            conn.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _relay(conn: socket.socket, pid: int) -> int:
    """Forward signals to the kernel's process group (as jupyter_client's killpg would reach an ordinary kernel and its
    children), and return its exit code; if the process that launched this client dies, the kernel goes too."""
    parent = os.getppid()

    def forward(signum, _frame):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    conn.settimeout(1.0)
    while True:
        try:
            reply = conn.recv(256).decode()
        except (InterruptedError, TimeoutError):
            if os.getppid() != parent:  # an ordinary kernel's parent poller would exit now
                forward(signal.SIGKILL, None)
            continue
        if reply.startswith("exit "):
            code = int(reply.split()[1])
            if code < 0:  # killed by a signal: end the same way, so the launcher sees what an ordinary kernel shows
                signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
            return code
        if not reply:  # the zygote went away: the kernel is gone with it
            return 1


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "serve":
        serve(argv[1])
        return 0
    if len(argv) >= 2 and argv[0] == "launch":
        return launch(argv[1], argv[2:])
    print("usage: python -m workbench.catalogue.kernel_fork serve SOCKET | launch SOCKET -f CONNECTION_FILE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
