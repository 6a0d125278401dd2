"""Where the repository's files are: its root (notebooks, runs, peer environments) and the ``data/`` folder
(shipped tokenizer, checkpoints, task files).

One home for the paths, so that the catalogue, the peers, the task files (``workbench.tasks``) and the models
(``workbench.modeling``) find them without importing each other.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "data"


def scratch_folder(prefix: str) -> str:
    """A new temporary folder that is removed when the process exits: for the throw-away output folders and saved
    model copies that TRL trainers and the peer probes need (without it, every test run left them in /tmp)."""
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, True)
    return folder
