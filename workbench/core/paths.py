"""Where the repository's files are: its root (notebooks, runs, peer environments) and the ``data/`` folder
(shipped tokenizer, checkpoints, task files).

One home for the paths, so that the catalogue, the peers, the task files (``workbench.tasks``) and the models
(``workbench.modeling``) find them without importing each other.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "data"
