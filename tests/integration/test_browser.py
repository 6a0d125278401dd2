"""A real browser: JupyterLab on a loopback port, the quickstart run top to bottom, a widget moved.

Needs Debian's Chromium at /usr/bin/chromium (``.ci/run`` installs it) and the Python playwright
package (no browser download: ``executable_path`` points at the system Chromium).
"""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Chromium is not installed at /usr/bin/chromium (apt-get install chromium)"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def jupyterlab(tmp_path):
    shutil.copytree(NOTEBOOKS, tmp_path / "notebooks")
    port, token = free_port(), "workbench-test"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    log = open(tmp_path / "jupyterlab.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path / 'notebooks'}", "--allow-root",
         "--LabApp.news_url=", "--LabServerApp.extension_manager=readonly"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    try:
        deadline = time.time() + 60
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


def accept_kernel_dialog(page, seconds: float = 10) -> None:
    """A fresh JupyterLab may ask which kernel to start ("Select Kernel"): accept its default (python3)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_selector(".jp-Dialog .jp-mod-accept", timeout=seconds * 1000)
    except PlaywrightTimeout:
        return
    page.locator(".jp-Dialog .jp-mod-accept").first.click()


def test_quickstart_runs_in_jupyterlab_and_a_widget_redraws(jupyterlab, tmp_path):
    from playwright.sync_api import sync_playwright

    base, token = jupyterlab
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{base}/lab/tree/00_quickstart.ipynb?token={token}")
        page.wait_for_selector(".jp-Notebook", timeout=60_000)
        accept_kernel_dialog(page)
        idle = ".jp-Notebook-ExecutionIndicator[data-status='idle']"
        page.wait_for_selector(idle, timeout=60_000)
        page.click("text=Run", timeout=10_000)
        page.click("text=Run All Cells", timeout=10_000)
        # every code cell numbered means every cell ran ("[*]" while queued or running)
        page.wait_for_function(
            "() => { const p = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')];"
            " return p.length > 0 && p.every(e => /\\[\\d+\\]/.test(e.textContent)); }",
            timeout=180_000,
        )
        page.wait_for_selector(idle, timeout=60_000)
        page.screenshot(path=str(tmp_path / "quickstart.png"))

        assert page.locator(".jp-OutputArea-output img").count() >= 2, "no figure rendered"
        text = page.inner_text(".jp-Notebook")
        assert "Traceback" not in text and "Error" not in text.replace("ErrorBar", "")
        assert "mechanism reproduced: yes, fixed: yes" in text

        widget_image = page.locator(".widget-output img, .jupyter-widgets-output-area img").first
        widget_image.wait_for(timeout=30_000)
        before = widget_image.get_attribute("src")
        page.locator(".widget-toggle-button", has_text="mask").first.click()
        page.wait_for_function(
            "(before) => { const img = document.querySelector('.widget-output img, .jupyter-widgets-output-area img');"
            " return img && img.getAttribute('src') !== before; }",
            arg=before, timeout=60_000,
        )
        page.screenshot(path=str(tmp_path / "quickstart_after_widget.png"))
        browser.close()
    assert (tmp_path / "quickstart.png").stat().st_size > 10_000
