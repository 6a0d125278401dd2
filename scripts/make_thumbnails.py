"""Refresh the README thumbnails from a catalogue run: one small PNG per notebook's main figure.

    python -m workbench run --out runs/docs && python scripts/make_thumbnails.py runs/docs
"""

import json
import sys
from pathlib import Path

from PIL import Image

DOCS = Path(__file__).resolve().parent.parent / "docs" / "thumbnails"

if __name__ == "__main__":
    run = Path(sys.argv[1])
    DOCS.mkdir(parents=True, exist_ok=True)
    summary = json.loads((run / "summary.json").read_text())
    for notebook in summary["notebooks"]:
        if not notebook.get("main_figure"):
            continue
        image = Image.open(Path(notebook["out_dir"]) / notebook["main_figure"]).convert("RGB")
        image.thumbnail((480, 240))
        target = DOCS / f"{notebook['stem']}.png"
        image.save(target, optimize=True)
        print(target, image.size, target.stat().st_size, "bytes")
