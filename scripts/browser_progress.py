"""Screenshot a notebook's training cell in JupyterLab while it trains: the progress bar a reader sees, with its ETA.

Usage: ``python scripts/browser_progress.py 05 13 --out runs/progress`` — each notebook (default parameters, as a
reader runs it) is copied into a fresh folder, opened in JupyterLab in Debian's Chromium (/usr/bin/chromium), run with
Run All; once a progress bar shows an ETA ("<mm:ss" in tqdm's text) the cell is scrolled into view and
``<stem>_progress.png`` is saved, with the bar's text printed; then the kernel is shut down (the run is not finished).
Exit code 2 when Chromium or a notebook is missing, 1 when no bar showed within ``--wait`` seconds.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from a checkout: the workbench package beside it
from workbench.catalogue.lab_server import jupyterlab_server, shut_down_kernels  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
BAR = ".jp-OutputArea-output .widget-hprogress"
TOKEN = "progress"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", help="notebook numbers or stems (05, 13_whitening)")
    parser.add_argument("--out", default="runs/progress", help="folder for the screenshots")
    parser.add_argument("--wait", type=float, default=900, help="seconds to wait for a bar with an ETA")
    args = parser.parse_args()
    if not CHROMIUM.exists():
        print(f"error: no Chromium at {CHROMIUM}; install it (apt-get install chromium)", file=sys.stderr)
        return 2
    stems = []
    for name in args.notebooks:
        found = sorted((REPO / "notebooks").glob(f"{name}*.ipynb"))
        if not found:
            print(f"error: no notebook matches {name!r} in notebooks/; give its number (05) or stem", file=sys.stderr)
            return 2
        stems.append(found[0].stem)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "notebooks"
        shutil.copytree(REPO / "notebooks", root)
        state = Path(tmp)
        settings = state / "settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True)
        (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
        with jupyterlab_server(root, state, TOKEN, JUPYTERLAB_SETTINGS_DIR=str(state / "settings")) as (base, token), \
                sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"])
            for stem in stems:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"{base}/lab/workspaces/{stem}/tree/{stem}.ipynb?reset&token={token}")
                page.wait_for_selector(".jp-Notebook", timeout=120_000)
                try:  # a fresh JupyterLab may ask which kernel to start: its default, python3
                    page.locator(".jp-Dialog .jp-mod-accept").first.click(timeout=10_000)
                except PlaywrightTimeout:
                    pass
                page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
                page.click("text=Run", timeout=10_000)
                page.click("text=Run All Cells", timeout=10_000)
                deadline, text = time.time() + args.wait, ""
                while time.time() < deadline:
                    if "Traceback" in page.inner_text(".jp-Notebook"):
                        print(f"{stem}: a cell failed before the bar showed", file=sys.stderr)
                        status, text = 1, ""
                        break
                    bars = page.locator(BAR)
                    if bars.count():
                        row = bars.last.locator("xpath=..")
                        text = row.inner_text().replace("\n", " ")
                        if "<" in text and "?" not in text.split("<")[1][:6]:
                            break
                    time.sleep(2)
                else:
                    print(f"{stem}: no progress bar with an ETA within {args.wait:.0f} s", file=sys.stderr)
                    status = 1
                if text:
                    page.locator(BAR).last.evaluate("bar => bar.scrollIntoView({block: 'center'})")
                    time.sleep(1)
                    page.screenshot(path=str(out / f"{stem}_progress.png"))
                    print(f"{stem}: {text} → {out / f'{stem}_progress.png'}")
                page.close()
                shut_down_kernels(base, token)
            browser.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
