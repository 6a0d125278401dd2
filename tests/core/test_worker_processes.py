"""core.worker_processes: workers forked from a clean copy of a warm process, or spawned.

Each check runs in a fresh interpreter: the fork server must be started in a process with one thread, and a pytest
worker runs several (execnet's)."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from workbench.core import worker_processes

_why_not = worker_processes.unsupported()  # the switch, set by whoever runs the tests, is not a reason to skip
pytestmark = pytest.mark.skipif(_why_not is not None and not _why_not.startswith(worker_processes.SWITCH_ENV), reason=str(_why_not))

PROBE = '''
import os, random, sys

def probe(_=None):
    """Where this worker comes from: its parent, whether numpy was imported before the job, its first draws."""
    import numpy
    return {"pid": os.getpid(), "parent": os.getppid(), "numpy_at_start": NUMPY_AT_START,
            "python_draw": random.random(), "numpy_draw": float(numpy.random.random())}

NUMPY_AT_START = "numpy" in sys.modules
'''

SCRIPT = '''
import json, os, random, sys
from concurrent.futures import ProcessPoolExecutor
import numpy
from workbench.core import worker_processes

def one_worker(context):
    """One job in a fresh one-worker pool: a new worker every time."""
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(__import__("probe").probe).result()

random.seed(0)
numpy.random.seed(0)
before = worker_processes.context().get_start_method()
spawned = one_worker(worker_processes.context())
server = worker_processes.start_fork_server()
forked = [one_worker(worker_processes.context()) for _ in range(2)]
print(json.dumps({"before": before, "after": worker_processes.context().get_start_method(), "server": server,
                  "spawned": spawned, "forked": forked, "me": os.getpid(),
                  "mine": [random.random(), float(numpy.random.random())]}))
'''


def _run(tmp_path, script: str, expect_code: int = 0, **variables: str) -> dict:
    (tmp_path / "probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != worker_processes.SWITCH_ENV}
    env.update(variables, PYTHONPATH=os.pathsep.join([str(tmp_path), os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == expect_code, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_workers_are_forks_of_the_server_with_the_imports_done_and_their_own_draws(tmp_path):
    seen = _run(tmp_path, SCRIPT)
    assert seen["before"] == "spawn" and seen["after"] == "forkserver"
    # a spawned worker is a child of the caller and imports numpy itself; a forked one is the server's child and has it
    assert seen["spawned"]["parent"] == seen["me"] and not seen["spawned"]["numpy_at_start"]
    for worker in seen["forked"]:
        assert worker["parent"] == seen["server"] and worker["numpy_at_start"]
    assert seen["forked"][0]["pid"] != seen["forked"][1]["pid"]
    # numpy's generator re-seeded from the OS in each worker, as a fresh interpreter's: not the caller's state (seeded 0)
    # copied twice (Python's own generator is re-seeded at every fork by the standard library already)
    numpy_draws = [w["numpy_draw"] for w in seen["forked"]]
    assert len(set(numpy_draws)) == 2 and seen["mine"][1] not in numpy_draws


def test_the_server_leaves_with_its_process(tmp_path):
    seen = _run(tmp_path, SCRIPT)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(seen["server"]):
        time.sleep(0.05)
    assert not _alive(seen["server"]), f"fork server {seen['server']} still running after its process exited"


def test_stop_reaps_the_server_and_falls_back_to_spawn(tmp_path):
    seen = _run(tmp_path, '''
        import json, os
        from workbench.core import worker_processes
        server = worker_processes.start_fork_server()
        again = worker_processes.unsupported()
        worker_processes.stop_fork_server()
        try:
            os.waitpid(server, os.WNOHANG)
            reaped = False
        except ChildProcessError:
            reaped = True
        print(json.dumps({"again": again, "reaped": reaped, "after": worker_processes.context().get_start_method()}))
    ''')
    assert seen == {"again": "this process already has a fork server", "reaped": True, "after": "spawn"}


def test_the_socket_is_private_and_removed_with_the_server(tmp_path):
    """The standard library's server unpickles what a client sends: its socket is a file only this user can reach (a
    0600 file in a 0700 folder), and the folder goes with the server."""
    seen = _run(tmp_path, '''
        import json, os
        from multiprocessing import forkserver
        from workbench.core import worker_processes
        worker_processes.start_fork_server()
        address = forkserver._forkserver._forkserver_address
        modes = [os.stat(address).st_mode & 0o777, os.stat(os.path.dirname(address)).st_mode & 0o777]
        worker_processes.stop_fork_server()
        print(json.dumps({"modes": modes, "left": os.path.exists(os.path.dirname(address))}))
    ''')
    assert seen == {"modes": [0o600, 0o700], "left": False}


def test_forked_workers_take_the_callers_environment_at_the_call(tmp_path):
    seen = _run(tmp_path, '''
        import json, os
        from workbench.core import worker_processes
        worker_processes.start_fork_server()
        os.environ["SET_AFTER_THE_SERVER"] = "yes"
        with worker_processes.pool(1) as pool:
            print(json.dumps(pool.submit(os.getenv, "SET_AFTER_THE_SERVER").result()))
    ''')
    assert seen == "yes"


def test_workers_die_with_a_killed_server(tmp_path):
    seen = _run(tmp_path, '''
        import json, os, signal, time
        from workbench.core import worker_processes
        server = worker_processes.start_fork_server()
        pool = worker_processes.pool(1)
        worker = pool.submit(os.getpid).result()
        def running(pid):
            try:
                return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[-1].split()[0] != "Z"
            except FileNotFoundError:
                return False
        os.kill(server, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and running(worker):
            time.sleep(0.05)
        print(json.dumps({"worker_running": running(worker)}))
        worker_processes.stop_fork_server()  # reaps the killed server, removes its socket's folder
        os._exit(0)  # not through the broken pool's exit handler
    ''')
    assert seen == {"worker_running": False}


def test_a_failed_fork_leaves_spawned_workers_and_nothing_open(tmp_path):
    seen = _run(tmp_path, '''
        import errno, json, os
        from workbench.core import worker_processes
        fds = set(os.listdir("/proc/self/fd"))
        def no_fork():
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        os.fork = no_fork  # as under a pids limit
        print(json.dumps({"server": worker_processes.start_fork_server(), "context": worker_processes.context().get_start_method(),
                          "new_fds": sorted(set(os.listdir("/proc/self/fd")) - fds)}))
    ''')
    assert seen == {"server": None, "context": "spawn", "new_fds": []}


def test_the_switch_turns_the_server_off(tmp_path):
    seen = _run(tmp_path, '''
        import json
        from workbench.core import worker_processes
        print(json.dumps({"server": worker_processes.start_fork_server(), "why": worker_processes.unsupported(),
                          "context": worker_processes.context().get_start_method()}))
    ''', WORKBENCH_FORK_WORKERS="0")
    assert seen == {"server": None, "why": "WORKBENCH_FORK_WORKERS=0", "context": "spawn"}


def test_a_child_of_the_owner_does_not_use_the_owners_server():
    """fork_server() belongs to the process that started it: a copy of the module state in a child says None."""
    saved = worker_processes._owner, worker_processes._server
    try:
        worker_processes._owner, worker_processes._server = os.getpid() + 1, 12345
        assert worker_processes.fork_server() is None and worker_processes.context().get_start_method() == "spawn"
    finally:
        worker_processes._owner, worker_processes._server = saved


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"  # a zombie has left; only its reaping is pending
    except FileNotFoundError:
        return False
