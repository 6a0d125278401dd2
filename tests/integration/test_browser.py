"""A real browser: JupyterLab on a loopback port, the quickstart run top to bottom, a widget moved.

Needs Debian's Chromium at /usr/bin/chromium (``.ci/run`` installs it) and the Python playwright
package (no browser download: ``executable_path`` points at the system Chromium).
"""

import os
import shutil
from pathlib import Path

import pytest

from workbench.catalogue.lab_server import jupyterlab_server, shut_down_kernels

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]  # headless in a container, nothing fetched on its own
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Chromium is not installed at /usr/bin/chromium (apt-get install chromium)"),
]


@pytest.fixture
def jupyterlab(tmp_path):
    shutil.copytree(NOTEBOOKS, tmp_path / "notebooks")
    with jupyterlab_server(tmp_path / "notebooks", tmp_path) as (base, token):
        yield base, token


def accept_kernel_dialog(page, seconds: float = 10) -> None:
    """A fresh JupyterLab may ask which kernel to start ("Select Kernel"): accept its default (python3)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_selector(".jp-Dialog .jp-mod-accept", timeout=seconds * 1000)
    except PlaywrightTimeout:
        return
    page.locator(".jp-Dialog .jp-mod-accept").first.click()


def run_all_cells(page, url: str, run_seconds: float, idle_seconds: float) -> None:
    """Open the notebook at ``url``, run all its cells from the Run menu and wait until every one has run.

    Waits up to ``run_seconds`` for every code cell to be numbered ("[*]" while queued or running), then up to
    ``idle_seconds`` for the kernel to be idle again.
    """
    page.goto(url)
    page.wait_for_selector(".jp-Notebook", timeout=60_000)
    accept_kernel_dialog(page)
    idle = ".jp-Notebook-ExecutionIndicator[data-status='idle']"
    page.wait_for_selector(idle, timeout=60_000)
    page.click("text=Run", timeout=10_000)
    page.click("text=Run All Cells", timeout=10_000)
    page.wait_for_function(
        "() => { const p = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')];"
        " return p.length > 0 && p.every(e => /\\[\\d+\\]/.test(e.textContent)); }",
        timeout=run_seconds * 1000,
    )
    page.wait_for_selector(idle, timeout=idle_seconds * 1000)


def test_quickstart_runs_in_jupyterlab_and_a_widget_redraws(jupyterlab, tmp_path):
    from playwright.sync_api import sync_playwright

    base, token = jupyterlab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        run_all_cells(page, f"{base}/lab/tree/00_quickstart.ipynb?token={token}", run_seconds=180, idle_seconds=60)
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


# ---- every notebook, opened as a reader opens it ------------------------------------------------------------------
# Each notebook of the catalogue is copied with its smoke parameters injected (the runner's parameters cell, interactive
# left True), opened in JupyterLab, run top to bottom, and one control of its explorer moved; a screenshot of the
# explorer after the move (and one of the notebook's end) goes to $WORKBENCH_SCREENSHOTS (default: the test's tmp folder)
# for a reviewer to look at. What is asserted: every cell ran, no traceback, the explorer drew and redrew.
EVERY_STEM = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
EXPLORER_CONTROLS = (  # the first one found is moved: a dropdown, a slider, a toggle not selected, a checkbox (last:
    # an explorer of the fix's switch draws both of its sides, so flipping it may redraw the same picture)
    ".jp-OutputArea-output .widget-dropdown select",
    ".jp-OutputArea-output .noUi-handle",
    ".jp-OutputArea-output .widget-toggle-button:not(.mod-active)",
    ".jp-OutputArea-output .widget-checkbox input",
)
OUTPUT_IMAGE = ".widget-output img, .jupyter-widgets-output-area img"
PROGRESS_BAR = ".jp-OutputArea-output .widget-hprogress"  # tqdm's notebook bar: an ipywidgets FloatProgress


@pytest.fixture(scope="module")
def smoke_copies(tmp_path_factory):
    """The notebooks with their smoke parameters injected (``interactive`` kept True), in a fresh folder."""
    import nbformat

    from workbench.catalogue.batch import parameterized_notebook
    from workbench.catalogue.listing import find_notebook, resolve_parameters

    folder = tmp_path_factory.mktemp("browser") / "notebooks"
    folder.mkdir()
    for stem in EVERY_STEM:
        info = find_notebook(stem)
        parameters = {k: v for k, v in resolve_parameters(info, {}, smoke=True).items() if k != "interactive"}
        nbformat.write(parameterized_notebook(info, parameters), str(folder / f"{stem}.ipynb"))
    return folder


@pytest.fixture(scope="module")
def lab_of_copies(smoke_copies):
    from playwright.sync_api import sync_playwright

    root = smoke_copies.parent
    settings = root / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')  # no news question on the page
    with jupyterlab_server(smoke_copies, root, JUPYTERLAB_SETTINGS_DIR=str(root / "settings")) as (base, token):
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            yield browser, base, token
            browser.close()


def _move_controls(page):
    """Move each explorer control found (``EXPLORER_CONTROLS``, in that order: every dropdown, slider, toggle not
    selected and checkbox), yielding a description after each move that changed the control: the caller stops at
    the first move that redraws the figure. A slider with one position, or one a key did not move, is passed over."""
    for selector in EXPLORER_CONTROLS:
        controls = page.locator(selector)
        for i in range(controls.count()):
            control = controls.nth(i)
            control.scroll_into_view_if_needed()
            if selector.endswith("select"):
                options = control.locator("option")
                current = control.input_value()
                values = [options.nth(j).get_attribute("value") for j in range(options.count())]
                if not any(v != current for v in values):
                    continue
                control.select_option(next(v for v in values if v != current))
            elif selector.endswith("noUi-handle"):  # one step, away from the end it stands at
                now, low, high = (control.get_attribute(f"aria-value{k}") for k in ("now", "min", "max"))
                if low == high:
                    continue
                control.focus()
                page.keyboard.press("ArrowLeft" if now == high else "ArrowRight")
                if control.get_attribute("aria-valuenow") == now:
                    continue
            else:
                if not control.is_visible():
                    continue
                control.click()
            yield f"{selector} #{i}"


@pytest.mark.slow
@pytest.mark.parametrize("stem", EVERY_STEM)
def test_every_notebook_runs_in_jupyterlab_and_its_explorer_redraws(lab_of_copies, stem, tmp_path):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    from workbench.catalogue.listing import read_notebook_info

    browser, base, token = lab_of_copies
    shots = Path(os.environ.get("WORKBENCH_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        # a workspace of its own, reset: JupyterLab would reopen the notebooks of the tests before
        run_all_cells(page, f"{base}/lab/workspaces/{stem}/tree/{stem}.ipynb?reset&token={token}",
                      run_seconds=600, idle_seconds=120)
        text = page.inner_text(".jp-Notebook")
        if "train_variants(" in (NOTEBOOKS / f"{stem}.ipynb").read_text():
            assert page.locator(PROGRESS_BAR).count() >= 1, f"{stem}: its training cell shows no progress bar"
        assert "Traceback" not in text, f"{stem}: a cell failed"
        assert "mechanism reproduced:" in text, f"{stem}: the closing line is missing"
        if "interactive" in read_notebook_info(NOTEBOOKS / f"{stem}.ipynb").parameters:  # it shows an explorer
            image = page.locator(OUTPUT_IMAGE).first
            image.wait_for(timeout=60_000)
            before, redrawn = image.get_attribute("src"), None
            for moved in _move_controls(page):
                try:
                    page.wait_for_function(
                        "([selector, before]) => { const img = document.querySelector(selector);"
                        " return img && img.getAttribute('src') !== before; }",
                        arg=[OUTPUT_IMAGE, before], timeout=60_000,
                    )
                except PlaywrightTimeout:  # this control's step drew the same picture: the next control
                    continue
                redrawn = moved
                break
            if redrawn is None:
                page.screenshot(path=str(shots / f"{stem}_explorer_unchanged.png"))
            assert redrawn is not None, (f"{stem}: no explorer control the test moved redrew the figure; the explorer's "
                                         f"output reads: {page.locator('.jupyter-widgets-output-area').last.inner_text()[-2000:]!r}")
            page.locator(OUTPUT_IMAGE).first.scroll_into_view_if_needed()
            page.screenshot(path=str(shots / f"{stem}_explorer.png"))
            assert "Traceback" not in page.inner_text(".jp-Notebook"), f"{stem}: the explorer failed after {redrawn}"
        page.evaluate("document.activeElement && document.activeElement.blur()")  # keys must not move the control
        page.keyboard.press("Control+End")
        page.locator(".jp-Cell").last.scroll_into_view_if_needed()
        page.screenshot(path=str(shots / f"{stem}_end.png"))
    finally:
        page.close()
        shut_down_kernels(base, token)
