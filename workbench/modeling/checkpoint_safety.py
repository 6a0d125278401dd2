"""Checkpoint safety: only local folders with safetensors weights and architectures built into transformers.

Pickle weights (``.bin``, ``.pt``, …) can run code when loaded and ``auto_map`` in config.json asks for
the checkpoint's own code (``trust_remote_code``); the workbench refuses both with an error that says
how to convert or what to use instead. Nothing is ever downloaded from a hub.
"""

from __future__ import annotations

import json
from pathlib import Path

from workbench.core.errors import ModelLoadError

PICKLE_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def check_checkpoint_folder(path: Path, known_names: tuple[str, ...] = ()) -> None:
    """Raise ``ModelLoadError`` unless ``path`` is a safe, complete local checkpoint folder
    (``known_names``: the built-in names a missing folder's message offers instead)."""
    if not path.exists():
        raise ModelLoadError(
            f"Checkpoint folder {str(path)!r} does not exist. Pass one of the built-in names "
            f"{', '.join(known_names)} or the path of a local Hugging Face checkpoint folder "
            "(nothing is downloaded from a hub)."
        )
    if not path.is_dir():
        raise ModelLoadError(f"{str(path)!r} is a file; pass the checkpoint *folder* that holds config.json.")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{str(path)!r} has no config.json; it is not a Hugging Face checkpoint folder.")
    config = json.loads((path / "config.json").read_text())
    if "auto_map" in config:
        raise ModelLoadError(
            f"{str(path)!r} needs custom code from the checkpoint (config.json has 'auto_map'). "
            "The workbench never uses trust_remote_code; use a checkpoint of an architecture "
            "built into transformers."
        )
    safetensors_files = list(path.glob("*.safetensors"))
    if not safetensors_files:
        pickles = [p.name for p in path.iterdir() if p.suffix in PICKLE_WEIGHT_SUFFIXES]
        if pickles:
            raise ModelLoadError(
                f"{str(path)!r} has only pickle weights ({', '.join(sorted(pickles))}); pickle files can "
                "run code when loaded, so the workbench refuses them. Convert the checkpoint once, in a "
                "trusted environment, with `model.save_pretrained(folder, safe_serialization=True)`."
            )
        raise ModelLoadError(f"{str(path)!r} has no *.safetensors weights file.")
