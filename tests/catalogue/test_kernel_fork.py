"""kernel_fork: kernels forked from the run's warm zygote behave like ordinary ones — started in the requested folder
with the requested environment and thread count, the catalogue's modules already loaded, interruptible, shut down
cleanly, killed with their client — and a run's numbers do not depend on it."""

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from workbench.catalogue import kernel_fork
from workbench.catalogue.batch import ipc_kernel_manager, run_catalogue

pytestmark = pytest.mark.skipif(kernel_fork.supported() is not None, reason=str(kernel_fork.supported()))

PROBE = ("import os, sys, json; print(json.dumps({'preloaded': 'torch' in sys.modules and 'workbench.pitfalls' in sys.modules, "
         "'cwd': os.getcwd(), 'threads': __import__('torch').get_num_threads(), 'marker': os.environ.get('MARKER'), "
         "'sys_path': sys.path, 'workers': __import__('workbench.core.worker_processes', fromlist=['_']).context().get_start_method()}))")
# an inline figure: the backend hooks into IPython when the kernel first draws, as in an ordinary kernel
FIGURE = "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([0, 1])\nplt.show()"


def test_the_kernel_command_is_replaced_only_for_ipykernel_and_only_while_a_zygote_runs(monkeypatch, tmp_path):
    cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", "conn.json"]
    monkeypatch.delenv(kernel_fork.SOCKET_ENV, raising=False)
    assert kernel_fork.kernel_command(cmd) == cmd
    monkeypatch.setenv(kernel_fork.SOCKET_ENV, "/tmp/z.sock")
    assert kernel_fork.kernel_command(cmd) == [sys.executable, "-m", "workbench.catalogue.kernel_fork", "launch", "/tmp/z.sock",
                                               "-f", "conn.json"]
    other = [sys.executable, "-m", "other_kernel", "-f", "conn.json"]
    assert kernel_fork.kernel_command(other) == other
    assert kernel_fork.kernel_command(["/usr/bin/python3-other", *cmd[1:]])[0] == "/usr/bin/python3-other"  # another interpreter
    assert kernel_fork.kernel_command(["/no/such/python", *cmd[1:]])[2] == "ipykernel_launcher"
    monkeypatch.setenv(kernel_fork.SWITCH_ENV, "0")
    assert kernel_fork.kernel_command(cmd) == cmd and kernel_fork.supported() == f"{kernel_fork.SWITCH_ENV}=0"


FORK_PROBE = """
import json, os, sys
from workbench.catalogue import kernel_fork
allowed = kernel_fork._allowed_threads()
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(write, str(kernel_fork._threads()).encode())
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps({"allowed": allowed, "in_the_fork": int(os.read(read, 16)),
                  "pools": [name for name in kernel_fork.BLAS_POOLS if name in sys.modules]}))
"""


def test_the_threads_the_zygote_allows_are_gone_in_a_fork():
    """The zygote allows the threads of the BLAS pools in ``BLAS_POOLS`` (numpy's OpenBLAS; scipy's copy where scipy is
    installed): a fork of a process that started them runs one thread — OpenBLAS stops its pool at fork."""
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2"}
    facts = json.loads(subprocess.run([sys.executable, "-c", FORK_PROBE], env=env, capture_output=True, text=True,
                                      check=True).stdout)
    assert "numpy" in facts["pools"]
    if facts["allowed"] < 2:  # one CPU (OpenBLAS caps its pool at the CPU count) or a numpy without OpenBLAS's pool
        pytest.skip(f"no BLAS thread pool started here to be stopped at fork: {facts}")
    assert facts["in_the_fork"] == 1, facts


def _run(client, code: str, timeout: float = 60) -> list[str]:
    lines = []
    client.execute_interactive(code, timeout=timeout, output_hook=lambda m: lines.append(m["content"].get("text", ""))
                               if m["msg_type"] == "stream" else None)
    return lines


@pytest.fixture(scope="module")
def zygote_socket():
    with kernel_fork.zygote() as path:
        yield path


def _started_kernel(tmp_path, monkeypatch):
    manager = ipc_kernel_manager()()
    monkeypatch.setenv("MARKER", "from-the-launcher")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("WORKBENCH_FORK_WORKERS", raising=False)  # core.worker_processes' switch: on, as by default
    manager.start_kernel(cwd=str(tmp_path))
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    return manager, client


def test_a_forked_kernel_runs_where_and_as_asked_with_the_modules_loaded(zygote_socket, tmp_path, monkeypatch):
    assert zygote_socket is not None and os.environ[kernel_fork.SOCKET_ENV] == str(zygote_socket)
    manager, client = _started_kernel(tmp_path, monkeypatch)
    # only this user may ask the zygote for a kernel: a 0600 socket file in a 0700 folder
    assert os.stat(zygote_socket).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(zygote_socket)).st_mode & 0o777 == 0o700
    try:
        facts = json.loads("".join(_run(client, PROBE)))
        sys_path = facts.pop("sys_path")
        # training workers fork from a copy of the kernel made before ipykernel's threads (core.worker_processes)
        assert facts == {"preloaded": True, "cwd": str(tmp_path), "threads": 1, "marker": "from-the-launcher",
                         "workers": "forkserver"}
        monkeypatch.delenv(kernel_fork.SOCKET_ENV)  # an ordinary kernel started the same way has the same sys.path
        ordinary, ordinary_client = _started_kernel(tmp_path, monkeypatch)
        try:
            ordinary_facts = json.loads("".join(_run(ordinary_client, PROBE)))
            assert ordinary_facts["sys_path"] == sys_path
            assert ordinary_facts["workers"] == "spawn"  # a threaded kernel from the start: its workers are spawned
        finally:
            ordinary_client.stop_channels()
            ordinary.shutdown_kernel(now=True)
        shown = []
        client.execute_interactive(FIGURE, timeout=60, output_hook=lambda m: shown.append(m["content"].get("data", {}))
                                   if m["msg_type"] == "display_data" else None)
        assert any("image/png" in data for data in shown), shown  # the inline backend works in a forked kernel
        # interruptible: SIGINT reaches the forked kernel through its client
        started = time.monotonic()
        client.execute("import time; time.sleep(30)")
        time.sleep(1.0)
        manager.interrupt_kernel()
        reply = client.get_shell_msg(timeout=20)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        assert time.monotonic() - started < 15
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)
    assert manager.provisioner is None or not manager.is_alive()


def test_a_dead_client_costs_only_its_own_request(zygote_socket, tmp_path, monkeypatch):
    import socket

    broken = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # connects, sends garbage, leaves
    broken.connect(str(zygote_socket))
    broken.send(b"not json")
    broken.close()
    manager, client = _started_kernel(tmp_path, monkeypatch)  # the zygote still forks for the next client
    try:
        assert json.loads("".join(_run(client, PROBE)))["preloaded"] is True
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_killing_the_client_kills_its_forked_kernel(zygote_socket, tmp_path, monkeypatch):
    manager, client = _started_kernel(tmp_path, monkeypatch)
    try:
        kernel_pid, server_pid = map(int, "".join(_run(
            client, "import os; from workbench.core import worker_processes; print(os.getpid(), worker_processes.fork_server())")).split())
        assert kernel_pid != manager.provisioner.process.pid  # a fork, not the launched process itself
        os.kill(manager.provisioner.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (os.path.exists(f"/proc/{kernel_pid}") or _running(server_pid)):
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{kernel_pid}")
        assert not _running(server_pid)  # the kernel's fork server for training workers goes with it
    finally:
        client.stop_channels()
        manager.cleanup_resources()


def test_a_kernel_shut_down_leaves_no_fork_server_behind(zygote_socket, tmp_path, monkeypatch):
    """The kernel's fork server for training workers goes with it and is reaped, not left a zombie of init: its CPU
    time counts in the runner's. And the kernel ends by itself, exit code 0: ipykernel's shutdown waits on children it
    signalled while they are listed, a zombie server included, and jupyter_client then kills the kernel (SIGTERM after
    2.5 s: exit code -15) — the kernel class stops the server first (catalogue_kernel)."""
    manager, client = _started_kernel(tmp_path, monkeypatch)
    kernel_pid, server_pid = map(int, "".join(_run(
        client, "import os; from workbench.core import worker_processes; print(os.getpid(), worker_processes.fork_server())")).split())
    launcher = manager.provisioner.process  # the kernel_fork client jupyter_client started: it exits as the kernel did
    client.stop_channels()
    manager.shutdown_kernel(now=False)
    assert launcher.returncode == 0
    assert not Path(manager.ip).parent.exists()  # the kernel's private socket folder goes with it (not only via nbclient)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in (kernel_pid, server_pid)):
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{kernel_pid}") and not os.path.exists(f"/proc/{server_pid}")


ORPHAN = '''
import os, time
zygote = os.getppid()
if os.fork() == 0:  # a child that leaves at once, its own child orphaned; only os calls after the fork
    if os.fork() == 0:
        time.sleep(0.5)
        os.write(os.open({path!r}, os.O_WRONLY | os.O_CREAT), f"{{os.getppid()}} {{zygote}}".encode())
    os._exit(0)
'''


def test_a_kernels_orphans_are_adopted_by_the_zygote(zygote_socket, tmp_path, monkeypatch):
    """The zygote is a child subreaper: a process orphaned under a kernel gets the zygote as parent, not init."""
    manager, client = _started_kernel(tmp_path, monkeypatch)
    try:
        _run(client, ORPHAN.format(path=str(tmp_path / "ppid")))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (tmp_path / "ppid").exists():
            time.sleep(0.1)
        time.sleep(0.1)
        parent, zygote = map(int, (tmp_path / "ppid").read_text().split())
        assert parent == zygote
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


@pytest.mark.slow
def test_a_forked_run_gives_the_numbers_of_ordinary_kernels(tmp_path):
    runs = {}
    for fork in (True, False):
        folder, results = run_catalogue(["20", "21"], smoke=True, out_dir=tmp_path / str(fork), progress=False, render_html=False,
                                        jobs_in_parallel=2, exercises=False, fork_kernels=fork)
        assert all(r.ok for r in results)
        runs[fork] = {r.stem: json.loads((folder / r.stem / "metrics.json").read_text())["metrics"] for r in results}
    assert runs[True] == runs[False]


@pytest.mark.slow
def test_training_workers_forked_in_a_forked_kernel_give_the_numbers_of_spawned_ones(tmp_path, monkeypatch):
    """Two training notebooks with 2 worker processes each: forks of the kernel's clean copy (forked kernels) against
    fresh interpreters (ordinary kernels) — every metric equal."""
    monkeypatch.delenv("WORKBENCH_FORK_WORKERS", raising=False)
    runs = {}
    for fork in (True, False):
        folder, results = run_catalogue(["04", "07"], smoke=True, overrides={"processes": 2}, out_dir=tmp_path / str(fork),
                                        progress=False, render_html=False, jobs_in_parallel=2, exercises=False, fork_kernels=fork)
        assert all(r.ok for r in results) and all(r.parameters["processes"] == 2 for r in results)
        runs[fork] = {r.stem: json.loads((folder / r.stem / "metrics.json").read_text())["metrics"] for r in results}
    assert runs[True] == runs[False]


def test_terminating_the_zygote_kills_its_kernels(zygote_socket, tmp_path, monkeypatch):
    """Last in the module: it terminates the module's zygote (the way ``kernel_fork.zygote`` ends it, SIGTERM)."""
    manager, client = _started_kernel(tmp_path, monkeypatch)
    kernel_pid, zygote_pid, socket_file = "".join(_run(
        client, "import os; from multiprocessing import forkserver; "
                "print(os.getpid(), os.getppid(), forkserver._forkserver._forkserver_address)")).split()
    kernel_pid, zygote_pid = int(kernel_pid), int(zygote_pid)
    folder = os.path.dirname(socket_file)  # the zygote's private folder of fork-server sockets
    assert os.path.exists(socket_file) and os.stat(folder).st_mode & 0o777 == 0o700 and os.stat(socket_file).st_mode & 0o777 == 0o600
    client.stop_channels()
    os.kill(zygote_pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (os.path.exists(f"/proc/{kernel_pid}") or os.path.exists(folder)):
        time.sleep(0.1)
    assert os.path.dirname(str(zygote_socket)) == folder and not os.path.exists(f"/proc/{kernel_pid}")
    assert not os.path.exists(folder)  # removed with the zygote, though the kernel never removed its socket
    manager.cleanup_resources()


def _running(pid: int) -> bool:
    """True while ``pid`` runs: a zombie (left, its reaping pending) or a missing process is not running."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
