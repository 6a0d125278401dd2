"""Where the repository's files are: the ``data/`` folder (shipped tokenizer, checkpoints, task files).

One home for the path, so that the task files (``workbench.tasks``) and the models (``workbench.modeling``)
find ``data/`` without importing each other.
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
