"""Read a run's history back from the trackers' own stores, the way a user would find it: trackio's local SQLite store
(through trackio's own ``SQLiteStorage``) and a W&B offline run's ``run-<id>.wandb`` file (its records decoded with
wandb's own protobuf classes). Shared by the tracker tests of ``tests/core`` and ``tests/cli``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

WANDB_BLOCK = 32768  # the .wandb file is a LevelDB-style log: 32 KiB blocks of records, each with a 7-byte header
WANDB_HEADER = 7  # the file's own header: b":W&B", a 2-byte magic and a version byte


def point_trackio_at(folder: Path, monkeypatch) -> None:
    """Make trackio store in ``folder``: ``TRACKIO_DIR`` for a first import, and the module constants trackio computed
    from it when an earlier test of this process imported trackio already."""
    monkeypatch.setenv("TRACKIO_DIR", str(folder))
    for name, module in list(sys.modules.items()):
        if name == "trackio" or name.startswith("trackio."):
            for constant, value in (("TRACKIO_DIR", folder), ("MEDIA_DIR", folder / "media"),
                                    ("ARTIFACTS_DIR", folder / "artifacts")):
                if isinstance(getattr(module, constant, None), Path):
                    monkeypatch.setattr(module, constant, value)


def trackio_history(project: str, run: str) -> dict[int, dict[str, float]]:
    """``{step: {metric: value}}`` of a trackio run, from the local store (the logs of one step merged)."""
    from trackio.sqlite_storage import SQLiteStorage

    history: dict[int, dict[str, float]] = {}
    for row in SQLiteStorage.get_logs(project, run):  # two logs at one step: two rows, merged here
        history.setdefault(row["step"], {}).update({k: v for k, v in row.items() if k not in ("step", "timestamp")})
    return history


def wandb_records(path: Path):
    """Every record (``wandb_internal_pb2.Record``) of a ``.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    position, pending = WANDB_HEADER, b""
    while position + 7 <= len(data):
        left = WANDB_BLOCK - position % WANDB_BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        length, kind = int.from_bytes(data[position + 4:position + 6], "little"), data[position + 6]
        if position + 7 + length > len(data):  # a record still being written
            break
        chunk = data[position + 7:position + 7 + length]
        position += 7 + length
        if kind == 0:  # zero padding
            continue
        pending = chunk if kind in (1, 2) else pending + chunk  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def finished_records(path: Path, seconds: float = 60.0) -> list:
    """The records of a W&B run file once its ``exit`` record is written: ``finish()`` can return while W&B's service
    process is still writing the file."""
    deadline = time.monotonic() + seconds
    while True:
        records = list(wandb_records(path))
        if any(record.WhichOneof("record_type") == "exit" for record in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def wandb_history(folder: Path) -> dict[int, dict[str, float]]:
    """``{step: {metric: value}}`` of the one W&B offline run under ``folder`` (``wandb/offline-run-*/run-*.wandb``)."""
    files = sorted(Path(folder).glob("**/offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    records = finished_records(files[0])
    history: dict[int, dict[str, float]] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {("/".join(item.nested_key) or item.key): json.loads(item.value_json) for item in record.history.item}
            step = int(items.pop("_step", record.history.step.num))
            history[step] = {k: v for k, v in items.items() if not k.startswith("_")}
    return history
