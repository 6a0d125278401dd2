"""Atomic, pickle-free checkpoints that a run can resume from.

A checkpoint is a folder ``<run_dir>/checkpoints/step-NNNNNN/`` holding

* ``<module>.safetensors``: the weights of each trained module;
* ``<optimizer>.optim.safetensors`` + the JSON part of its state (step counts, param groups);
* ``rng.safetensors``: the torch RNG state; ``state.json``: step, history, Python RNG state,
  anything else the trainer needs (JSON only).

Nothing is ever unpickled. Every file is written into a temporary folder that is renamed into
place in one ``os.replace``, and the ``latest`` pointer is updated the same way afterwards: an
interrupted write leaves either the previous checkpoint or the new one, never a half-written
folder that a resume would trust. ``manifest.json`` records each file's size and SHA-256; a resume
verifies them (``verify_checkpoint``) and falls back to the newest checkpoint that verifies
(``latest_valid_checkpoint``), saying which one it skipped and why, so a truncated or corrupted
file is never trained from.

A training holds its run folder (``run_folder_lock``: ``core.folder_lock``'s ``flock`` on ``<run_dir>/.lock``, released
by the operating system when the process ends, even by ``SIGKILL``) for as long as it may write there; a second
training into the same folder is refused (``RunFolderInUse``) instead of interleaving its checkpoints with the
first's. Holding it, the training removes what an interrupted save left (``remove_unfinished_saves``): the
temporary folders and files never renamed into place, each as large as a checkpoint, which no resume reads.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from workbench.core import folder_lock

CHECKPOINT_DIR = "checkpoints"
LATEST = "latest"
MANIFEST = "manifest.json"


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=_json_default) + "\n")


def _json_default(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _optimizer_to_files(optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    state_dict = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, param_state in state_dict["state"].items():
        for key, value in param_state.items():
            if torch.is_tensor(value):
                tensors[f"{index}.{key}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{index}.{key}"] = value
    return tensors, {"param_groups": state_dict["param_groups"], "scalars": scalars}


def _optimizer_from_files(tensors: dict, meta: dict) -> dict:
    state: dict[int, dict] = {}
    for name, value in list(tensors.items()) + list(meta["scalars"].items()):
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    modules: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    state: dict,
    generators: dict[str, torch.Generator] | None = None,
    keep: int = 2,
) -> Path:
    """Write a checkpoint for ``step`` atomically and point ``latest`` at it."""
    root = Path(run_dir) / CHECKPOINT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-step-{step:06d}-"))
    try:
        for name, module in modules.items():
            weights = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
            save_file(_untie(weights), str(tmp / f"{name}.safetensors"))
        for name, optimizer in optimizers.items():
            tensors, meta = _optimizer_to_files(optimizer)
            save_file(tensors, str(tmp / f"{name}.optim.safetensors"))
            atomic_write_json(tmp / f"{name}.optim.json", meta)
        rng = {"torch": torch.random.get_rng_state()}
        for name, generator in (generators or {}).items():
            rng[f"generator.{name}"] = generator.get_state()
        save_file(rng, str(tmp / "rng.safetensors"))
        atomic_write_json(tmp / "state.json", {"step": step, **state})
        atomic_write_json(tmp / MANIFEST, {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
                                           for p in sorted(tmp.iterdir()) if p.is_file()})
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(root / LATEST, final.name + "\n")
    older = sorted(p for p in root.glob("step-*") if p != final)
    for old in older[: max(0, len(older) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return final


@contextlib.contextmanager
def run_folder_lock(run_dir: str | Path | None):
    """Hold ``run_dir`` for a training (``core.folder_lock``; None: nothing to hold): ``RunFolderInUse`` when another
    training holds it. Holding it, ``remove_unfinished_saves``."""
    if run_dir is None:
        yield
        return
    with folder_lock.held(run_dir, writer="training", collision="interleave their checkpoints and histories",
                          fix="give this one another output folder (--output-dir / output_dir=)"):
        removed = remove_unfinished_saves(run_dir)
        if removed:
            print(f"note: removed {len(removed)} unfinished checkpoint write(s) left by an interrupted save: {', '.join(removed)}")
        yield


def remove_unfinished_saves(run_dir: str | Path) -> list[str]:
    """Delete what interrupted saves left in ``<run_dir>/checkpoints``: ``.tmp-step-*`` folders and ``.*.tmp`` files
    (``save_checkpoint``'s and ``atomic_write_text``'s temporaries, never renamed into place). Only safe while no save
    runs, hence called under ``run_folder_lock``. Returns their names."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    removed = []
    for path in sorted(root.iterdir()):
        if path.is_dir() and path.name.startswith(".tmp-step-"):
            shutil.rmtree(path, ignore_errors=True)
        elif path.is_file() and path.name.startswith(".") and path.name.endswith(".tmp"):
            with contextlib.suppress(OSError):
                path.unlink()
        else:
            continue
        if not path.exists():  # (a folder another user owns may stay: not counted)
            removed.append(path.name)
    return removed


def _untie(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses shared storage (tied embeddings): clone duplicates."""
    seen, out = set(), {}
    for key, value in weights.items():
        ptr = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape))
        out[key] = value.clone() if ptr in seen else value
        seen.add(ptr)
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_checkpoint(folder: str | Path) -> str | None:
    """None when every file listed in the folder's manifest is there with its size and checksum,
    else the reason it cannot be trusted."""
    folder = Path(folder)
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return f"{folder.name} has no {MANIFEST} (written by an older workbench, or incomplete)"
    try:
        entries = json.loads(manifest.read_text())
    except json.JSONDecodeError:
        return f"{folder.name}/{MANIFEST} is not valid JSON"
    for name, expected in entries.items():
        path = folder / name
        if not path.is_file():
            return f"{folder.name}/{name} is missing"
        size = path.stat().st_size
        if size != expected["bytes"]:
            return f"{folder.name}/{name} has {size} bytes, {expected['bytes']} were written (truncated or overwritten)"
        if _sha256(path) != expected["sha256"]:
            return f"{folder.name}/{name} does not match its recorded SHA-256 (corrupted)"
    return None


def latest_valid_checkpoint(run_dir: str | Path) -> tuple[Path | None, list[tuple[str, str]]]:
    """The newest checkpoint that verifies, starting from ``latest``, and the ``(folder, reason)``
    of every newer one that was skipped. ``(None, skipped)`` when none verifies."""
    root = Path(run_dir) / CHECKPOINT_DIR
    candidates = sorted(root.glob("step-*"), reverse=True) if root.is_dir() else []
    pointed = latest_checkpoint(run_dir)
    if pointed is not None and pointed in candidates:  # latest first, then older ones
        candidates.remove(pointed)
        candidates.insert(0, pointed)
    skipped = []
    for folder in candidates:
        reason = verify_checkpoint(folder)
        if reason is None:
            return folder, skipped
        skipped.append((folder.name, reason))
    return None, skipped


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The folder ``latest`` points to, or None when the run has no complete checkpoint."""
    root = Path(run_dir) / CHECKPOINT_DIR
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    folder = root / pointer.read_text().strip()
    return folder if (folder / "state.json").is_file() else None


def load_checkpoint(
    folder: str | Path,
    *,
    modules: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    generators: dict[str, torch.Generator] | None = None,
) -> dict:
    """Restore modules, optimizers, RNG states in place; return the JSON ``state``."""
    folder = Path(folder)
    for name, module in modules.items():
        module.load_state_dict(load_file(str(folder / f"{name}.safetensors")), strict=True)
    for name, optimizer in optimizers.items():
        tensors = load_file(str(folder / f"{name}.optim.safetensors"))
        meta = json.loads((folder / f"{name}.optim.json").read_text())
        optimizer.load_state_dict(_optimizer_from_files(tensors, meta))
    rng = load_file(str(folder / "rng.safetensors"))
    torch.random.set_rng_state(rng["torch"])
    for name, generator in (generators or {}).items():
        generator.set_state(rng[f"generator.{name}"])
    return json.loads((folder / "state.json").read_text())
