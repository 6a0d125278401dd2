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
zygote that finds a thread in itself beyond OpenBLAS's pool (a fork of a threaded process can inherit a held
lock — the reason the batch runner spawns its own workers; OpenBLAS, loaded by numpy, shuts its pool down
at fork through ``pthread_atfork``, so its threads are allowed). ``WORKBENCH_FORK_KERNELS=0`` turns the zygote off.

The module imports only the standard library at the top: the client must start in milliseconds. The
zygote's heavy imports are in ``PRELOAD`` and happen inside ``serve``.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOCKET_ENV = "WORKBENCH_KERNEL_ZYGOTE"
SWITCH_ENV = "WORKBENCH_FORK_KERNELS"
# What the catalogue's notebooks import before their first computation. A module that fails to import here
# is simply imported by the kernel itself; none of them draws, seeds or starts a thread at import.
PRELOAD = (
    "numpy", "torch", "transformers", "safetensors.torch", "matplotlib.pyplot", "matplotlib_inline.backend_inline",
    "IPython", "ipykernel.kernelapp", "ipykernel.ipkernel", "ipywidgets",
    "transformers.models.qwen2.modeling_qwen2", "transformers.models.llama.modeling_llama",
    "transformers.models.gpt2.modeling_gpt2", "transformers.models.gemma2.modeling_gemma2",
    "workbench.catalogue.notebook_api", "workbench.experiments.checkpoints", "workbench.experiments.comparison",
    "workbench.experiments.statistics", "workbench.modeling.models", "workbench.viz.plots", "workbench.pitfalls",
)
MESSAGE_BYTES = 1 << 20  # one request: the kernel's arguments, folder and environment


def supported() -> str | None:
    """None where kernels can be forked here; otherwise the reason they cannot."""
    if os.environ.get(SWITCH_ENV, "1") == "0":
        return f"{SWITCH_ENV}=0"
    if not hasattr(os, "fork") or not hasattr(socket, "SOCK_SEQPACKET") or not sys.platform.startswith("linux"):
        return f"forking kernels needs fork() and SOCK_SEQPACKET Unix sockets (Linux); this is {sys.platform}"
    return None


# ---- the runner's side ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def zygote(enabled: bool = True):
    """Run a zygote for the duration of the block and point ``SOCKET_ENV`` at it (restored after); does
    nothing where ``supported()`` gives a reason or ``enabled`` is False."""
    if not enabled or supported() is not None:
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="workbench-zygote-"))
    path = folder / "zygote.sock"
    process = subprocess.Popen([sys.executable, "-m", "workbench.catalogue.kernel_fork", "serve", str(path)],
                               stdin=subprocess.DEVNULL)
    previous = os.environ.get(SOCKET_ENV)
    os.environ[SOCKET_ENV] = str(path)
    try:
        yield path
    finally:
        if previous is None:
            os.environ.pop(SOCKET_ENV, None)
        else:
            os.environ[SOCKET_ENV] = previous
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()


def kernel_command(cmd: list[str]) -> list[str]:
    """The kernel command line with ``-m ipykernel_launcher`` replaced by the client when a zygote runs."""
    path = os.environ.get(SOCKET_ENV)
    if not path or supported() is not None or cmd[1:3] != ["-m", "ipykernel_launcher"]:
        return cmd
    return [cmd[0], "-m", "workbench.catalogue.kernel_fork", "launch", path, *cmd[3:]]


# ---- the zygote ----------------------------------------------------------------------------------------------------
def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def serve(path: str) -> None:
    """Listen on ``path`` at once, import ``PRELOAD``, then fork a kernel per request until the parent exits."""
    import importlib  # the zygote's own imports: stdlib

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the runner, which terminates the zygote
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)  # clients may connect now; they wait for their reply while the imports run
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")  # what ipykernel would set
    with contextlib.suppress(Exception):
        importlib.import_module("numpy")
    allowed = _threads()  # this process and OpenBLAS's pool, which pthread_atfork shuts down at every fork
    for name in PRELOAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    if "workbench.pitfalls" in sys.modules:
        import pkgutil
        for module in pkgutil.iter_modules(sys.modules["workbench.pitfalls"].__path__):
            with contextlib.suppress(Exception):
                importlib.import_module(f"workbench.pitfalls.{module.name}")
    kernels: dict[socket.socket, int] = {}
    try:
        while os.getppid() == parent:
            ready, _, _ = select.select([listener, *kernels], [], [], 0.5)
            for sock in ready:
                if sock is listener:
                    _accept(listener, kernels, allowed)
                elif not _recv_or_empty(sock):  # the client died: its kernel goes too
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(kernels[sock], signal.SIGKILL)
            _reap(kernels)
    finally:
        for pid in kernels.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _accept(listener: socket.socket, kernels: dict, allowed: int) -> None:
    conn, _ = listener.accept()
    conn.settimeout(10)
    try:
        message, fds, _, _ = socket.recv_fds(conn, MESSAGE_BYTES, 3)
    except OSError:
        conn.close()
        return
    request = json.loads(message)
    threads = _threads()
    if threads > allowed or len(fds) != 3:
        conn.send(f"nofork the zygote runs {threads} threads, {allowed} expected (a fork could inherit a held lock)".encode())
        conn.close()
        for fd in fds:
            os.close(fd)
        return
    pid = os.fork()
    if pid == 0:  # the kernel: never returns
        listener.close()
        for other in kernels:
            other.close()
        conn.close()
        _become_kernel(request, fds)
    for fd in fds:
        os.close(fd)
    conn.settimeout(None)
    conn.send(f"pid {pid}".encode())
    kernels[conn] = pid


def _recv_or_empty(sock: socket.socket) -> bytes:
    try:
        return sock.recv(64)
    except OSError:
        return b""


def _reap(kernels: dict) -> None:
    while kernels:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
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
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = request["cwd"]  # what ``python -m ipykernel_launcher`` started there would have
        import random  # stdlib; numpy and torch are already loaded
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        threads = os.environ.get("OMP_NUM_THREADS")
        if threads and threads.isdigit() and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(int(threads))
        # ipykernel reads JPY_PARENT_PID into a trait default when it is imported, i.e. in the zygote: say it again
        parent = os.environ.get("JPY_PARENT_PID", "")
        sys.argv = ["ipykernel_launcher", *request["argv"], *([f"--IPKernelApp.parent_handle={parent}"] if parent.isdigit() else [])]
        from ipykernel import kernelapp  # already imported by the zygote

        kernelapp.launch_new_instance()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 — a kernel that fails must still leave through os._exit
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


# ---- the client ----------------------------------------------------------------------------------------------------
def launch(path: str, argv: list[str]) -> int:
    """Ask the zygote at ``path`` for a kernel with ``argv``; wait for it and return its exit code. Falls back
    to exec'ing an ordinary kernel when no fork can be had."""
    reason = supported()
    if reason is None:
        try:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            conn.connect(path)
            request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}
            socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
            reply = conn.recv(256).decode()
        except OSError as exc:
            reply = f"nofork no zygote at {path} ({exc})"
        if reply.startswith("pid "):
            return _relay(conn, int(reply.split()[1]))
        reason = reply.removeprefix("nofork ") or "the zygote closed the connection"
    print(f"workbench: starting an ordinary kernel ({reason})", file=sys.stderr)
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *argv])
    return 1  # not reached


def _relay(conn: socket.socket, pid: int) -> int:
    def forward(signum, _frame):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        try:
            reply = conn.recv(256).decode()
        except InterruptedError:
            continue
        if reply.startswith("exit "):
            return int(reply.split()[1])
        if not reply:  # the zygote went away: the kernel is gone with it
            time.sleep(0.1)
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
