import contextlib
import os
import subprocess
import sys

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _close_figures():
    """Figures drawn through pyplot are closed after each test (a notebook's inline backend closes them after display;
    here they would pile up: "More than 20 figures have been opened" in every run). A closed figure stays readable."""
    yield
    import sys

    pyplot = sys.modules.get("matplotlib.pyplot")  # only where a test imported it
    if pyplot is not None:
        pyplot.close("all")


@pytest.fixture
def hold_elsewhere():
    """``hold_elsewhere(folder, writer)``: a context manager holding ``folder``'s lock (``core.folder_lock``) from another
    process, as a second writer finds it (holds of one process nest); yields that process's pid, killed at the end."""

    @contextlib.contextmanager
    def hold(folder, writer="training"):
        code = ("import sys, time\nfrom workbench.core.folder_lock import held\n"
                "with held(sys.argv[1], writer=sys.argv[2], collision='collide', fix='wait'):\n"
                "    print('held', flush=True)\n    time.sleep(300)")
        holder = subprocess.Popen([sys.executable, "-c", code, str(folder), writer], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "held", "the holding process did not start"
            yield holder.pid
        finally:
            holder.kill()
            holder.wait(timeout=30)
            holder.stdout.close()

    return hold


@pytest.fixture(scope="session")
def tokenizer():
    from workbench.modeling.tokenizer import load_char_tokenizer

    return load_char_tokenizer()


def pytest_configure(config):
    """One torch thread per xdist worker: two workers on two cores, not four threads fighting for them."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


# The test files that take longest (seconds of one 2-core run, `pytest -n auto --dist loadfile --junitxml`, 2026-11-27:
# process-level checks that start kernels, CLIs or browsers), heaviest first. Under `--dist loadfile` a file is one unit
# of work; run last, a 70-second file keeps one worker busy while the other has nothing left, so the Makefile passes
# `--no-loadscope-reorder` (xdist otherwise orders files by their number of tests, which puts these near the end) and
# they are moved to the front here: the longest jobs first, the short ones filling in behind them. The order does not
# change what a test checks; a file missing from this list keeps its place after them.
RUN_FIRST = (
    "tests/integration/test_runner.py",        # 60-100 s: an interrupted batch run resumed, a failing notebook among others
    "tests/engines/test_engine_sampler.py",    # 50 s with the engine environment (two engine starts, a 3-step GRPO run)
    "tests/integration/test_notebooks.py",     # 45-52 s: the smoke catalogue of notebooks 00-05
    "tests/integration/test_browser.py",       # 30 s: JupyterLab in Chromium
    "tests/integration/test_distributed.py",   # 20 s: two CPU processes against one
    "tests/catalogue/test_kernel_fork.py",     # 16 s
    "tests/cli/test_audit_cli.py",             # 15 s: the audit CLI through real processes
    "tests/exercises/test_sandbox.py",         # 10 s
    "tests/integration/test_real_checkpoints.py",  # 10 s
    "tests/cli/test_watch.py",                 # 9 s
)


def pytest_collection_modifyitems(config, items):
    """The files of ``RUN_FIRST`` first, in its order; every other test keeps its collected order (a stable sort, the
    same on every xdist worker, as xdist requires)."""
    rank = {path: i for i, path in enumerate(RUN_FIRST)}
    root = config.rootpath

    def key(item):
        path = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else str(item.path)
        return rank.get(path, len(RUN_FIRST))

    items.sort(key=key)
