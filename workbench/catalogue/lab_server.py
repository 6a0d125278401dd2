"""A JupyterLab server for a real browser to drive: started on a free loopback port, isolated from the user's settings.

``jupyterlab_server(root_dir, state)`` serves ``root_dir`` with its config, runtime folder and log (``jupyterlab.log``)
under ``state`` and yields ``(url, token)``; it stops the server on exit. ``shut_down_kernels(url, token)`` shuts every
kernel down (a closed page leaves its kernel running, with its models in memory). The browser test
(``tests/integration/test_browser.py``) and ``scripts/browser_progress.py`` drive JupyterLab through them.
Standard library only; JupyterLab is the project's own dependency.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

START_SECONDS = 60  # how long to wait for the server's port to open


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def jupyterlab_server(root_dir: Path, state: Path, token: str = "workbench-lab", **env_extra: str):
    """JupyterLab serving ``root_dir``, its config, runtime folder and log under ``state``; ``env_extra`` adds
    environment variables (``JUPYTERLAB_SETTINGS_DIR``). Yields ``(url, token)``; waits up to ``START_SECONDS`` for
    the port to open; the news feed is off and the extension manager read-only (nothing fetched)."""
    port = free_port()
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(state / "config"), JUPYTER_RUNTIME_DIR=str(state / "runtime"),
               **env_extra)
    log = open(state / "jupyterlab.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root_dir}", "--allow-root",
         "--LabApp.news_url=", "--LabServerApp.extension_manager=readonly"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    try:
        deadline = time.time() + START_SECONDS
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}", token
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def shut_down_kernels(base: str, token: str) -> int:
    """Shut down every kernel of the server at ``base``; returns how many there were."""
    headers = {"Authorization": f"token {token}"}
    with urllib.request.urlopen(urllib.request.Request(f"{base}/api/kernels", headers=headers), timeout=30) as reply:
        kernels = json.load(reply)
    for kernel in kernels:
        request = urllib.request.Request(f"{base}/api/kernels/{kernel['id']}", method="DELETE", headers=headers)
        urllib.request.urlopen(request, timeout=30).close()
    return len(kernels)
