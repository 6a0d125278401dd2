"""Stream the responses of rollout dumps, one ``Rollout`` at a time, whatever wrote them: the generic format (JSONL or
Parquet), slime's ``--save-debug-rollout-data`` files and verl's ``trainer.rollout_data_dir`` JSONL.

Memory stays bounded by one line, one Parquet batch or one slime file (slime writes one per rollout step), never the
whole dump. Nothing is unpickled: slime's ``torch.save`` files are read with ``torch.load(weights_only=True)``,
which accepts only tensors and plain containers, and verl's pickled ``DataProto`` (``save_to_disk``) is refused
with the way round it. Every error is a ``DumpError`` naming the file and the line (or row, or sample).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator

import numpy as np

from workbench.core import progress
from workbench.inspect.records import FIELDS, DumpError, Rollout, validate

FORMATS = ("auto", "generic", "slime", "verl")
PARQUET_BATCH = 2048
BAR_BYTES = 20 * 2**20  # a bar for reads longer than this
SLIME_STATUS = {"completed": "stop", "truncated": "length", "aborted": "abort", "failed": "abort", "pending": None}
VERL_PICKLE = ("is a pickle (verl's DataProto.save_to_disk pickles the whole object), and the inspector never unpickles: "
               "set trainer.rollout_data_dir for verl's JSONL dump, or, in verl's environment, write the generic JSONL from "
               "the batch's tensors (prompts, responses, rollout_log_probs, old_log_probs, response_mask, token_level_scores) "
               "with workbench.inspect.export.verl_batch_records")


def _files(paths: Iterable) -> list[str]:
    files = []
    for path in paths:
        path = os.fspath(path)
        if os.path.isdir(path):
            inside = sorted((os.path.join(path, name) for name in os.listdir(path)
                             if name.endswith((".jsonl", ".parquet", ".pt"))), key=_step_order)
            if not inside:
                raise DumpError(path, "a folder without .jsonl, .parquet or .pt files; name the dump files")
            files += inside
        elif os.path.exists(path):
            files.append(path)
        else:
            raise DumpError(path, "no such file or folder")
    return files


def _step_order(path: str):
    """By the last number in the file's name (verl's ``12.jsonl``, slime's ``rollout_12.pt``, ``rollouts-000012.jsonl``)."""
    numbers = re.findall(r"\d+", os.path.basename(path).split(".")[0])
    return (0, int(numbers[-1]), path) if numbers else (1, 0, path)


def detect(path: str) -> str:
    """``generic``, ``slime`` or ``verl`` from a file's suffix and first record."""
    if path.endswith(".pt"):
        return "slime"
    if path.endswith(".parquet"):
        return "generic"
    with open(path, "rb") as handle:
        head = handle.read(2)
        if head[:1] == b"\x80":  # the pickle protocol's opening byte
            raise DumpError(path, VERL_PICKLE)
        handle.seek(0)
        for number, raw in enumerate(handle, 1):
            if raw.strip():
                record = _json_line(raw, path, number)
                return "verl" if isinstance(record, dict) and "output" in record and "response_ids" not in record else "generic"
    return "generic"


def _json_line(raw: bytes, path: str, number: int):
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DumpError(f"{path}:{number}", f"not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); write the dump as "
                                            "UTF-8 JSON (json.dumps escapes other characters)") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DumpError(f"{path}:{number}", f"not valid JSON ({exc.msg} at column {exc.colno}); a line cut short by a writer that "
                                            "stopped mid-write? drop the line or rewrite the dump") from None


def _jsonl(path: str, convert, tick) -> Iterator[Rollout]:
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            tick(len(raw))
            if raw.strip():
                yield convert(_json_line(raw, path, number), f"{path}:{number}")


def _parquet(path: str, tick) -> Iterator[Rollout]:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow is a pinned dependency
        raise DumpError(path, "reading Parquet needs pyarrow (pip install pyarrow), or give the dump as JSONL") from None
    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow's errors: ArrowInvalid, OSError
        raise DumpError(path, f"not a readable Parquet file ({exc}); give the dump as Parquet or JSONL") from None
    columns = [name for name in parquet.schema_arrow.names if name in FIELDS]
    row = 0
    for batch in parquet.iter_batches(batch_size=PARQUET_BATCH, columns=columns):
        tick(batch.nbytes)
        values = {}
        for name in columns:
            column = batch.column(name)
            if hasattr(column, "offsets"):  # a list column: one flat array, sliced per row
                offsets, flat = column.offsets.to_numpy(), column.values.to_numpy(zero_copy_only=False)
                valid = column.is_valid().to_numpy(zero_copy_only=False)
                values[name] = [flat[offsets[i]:offsets[i + 1]] if valid[i] else None for i in range(len(column))]
            else:
                values[name] = column.to_pylist()
        for i in range(batch.num_rows):
            yield validate({name: values[name][i] for name in columns}, f"{path}:row {row + i}")
        row += batch.num_rows


def verl_record(record, where: str) -> Rollout:
    """A text-only ``Rollout`` from a line of verl's ``rollout_data_dir`` dump (``input``, ``output``, ``score``,
    ``step``, ``gts`` and the reward's extra fields; ``uid`` "{sample}_{rollout}_{output}" when verl wrote it)."""
    if not isinstance(record, dict) or not isinstance(record.get("output"), str) or "step" not in record:
        raise DumpError(where, 'not a verl rollout_data_dir record ({"input", "output", "score", "step", ...}); '
                               "pass --format generic for the generic format")
    uid = record.get("uid")
    if isinstance(uid, str) and uid.count("_") >= 2:
        group = uid.rsplit("_", 2)[0]
    else:  # verl's trainer keeps no group id in this dump: one prompt text is one group
        group = hashlib.sha1(str(record.get("input", "")).encode("utf-8", "replace")).hexdigest()[:12]
    return validate({"step": record["step"], "group": group, "reward": record.get("score"),
                     "prompt_text": str(record.get("input", "")), "response_text": record["output"]}, where)


def slime_records(path: str, tick) -> Iterator[Rollout]:
    """slime's debug rollout data: ``torch.save({"rollout_id", "samples": [Sample.to_dict()…]})``."""
    import pickle

    import torch

    tick(os.path.getsize(path))
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DumpError(path, f"not readable as slime debug rollout data without unpickling arbitrary objects ({first}); "
                              "slime's --save-debug-rollout-data saves plain dicts of lists: re-save with "
                              "torch.save({'rollout_id': i, 'samples': [s.to_dict() for s in samples]}, path)") from None
    if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
        raise DumpError(path, "not slime debug rollout data (a dict with 'rollout_id' and a list 'samples')")
    step = data.get("rollout_id", 0)
    step = int(step) if not isinstance(step, str) else int(step.removeprefix("eval_") or 0)
    for index, sample in enumerate(data["samples"]):
        yield slime_sample(sample, step, f"{path}:sample {index}")


def _plain(value):
    return value.tolist() if hasattr(value, "tolist") else value


def slime_sample(sample, step: int, where: str) -> Rollout:
    if not isinstance(sample, dict) or "tokens" not in sample:
        raise DumpError(where, "not a slime Sample dict (no 'tokens'); save samples with Sample.to_dict()")
    tokens = np.asarray(_plain(sample["tokens"]), dtype=np.int64)
    length = int(sample.get("response_length") or 0)
    if length > len(tokens):
        raise DumpError(where, f"response_length {length} is longer than its {len(tokens)} tokens")
    reward = sample.get("reward")
    if isinstance(reward, dict):  # slime's reward_key picks one; take "score" when there
        reward = reward.get("score")
    status = sample.get("status")
    status = getattr(status, "value", status)
    group = sample.get("group_index")
    return validate({"step": step, "group": group if group is not None else sample.get("index", 0),
                     "prompt_ids": tokens[: len(tokens) - length], "response_ids": tokens[len(tokens) - length:],
                     "rollout_logprobs": _plain(sample.get("rollout_log_probs")), "loss_mask": _plain(sample.get("loss_mask")),
                     "reward": reward, "finish": SLIME_STATUS.get(status)}, where)


def read(paths, format: str = "auto", show_progress: bool = True) -> Iterator[Rollout]:
    """Every response of the dump files (folders: their .jsonl/.parquet/.pt files, in step order)."""
    if format not in FORMATS:
        raise DumpError("--format", f"{format!r}; use one of {FORMATS}")
    files = _files([paths] if isinstance(paths, (str, os.PathLike)) else paths)
    total = sum(os.path.getsize(path) for path in files)
    bar = progress.bar(total, "reading the dump", unit="B") if show_progress and total > BAR_BYTES else None
    tick = bar.update if bar is not None else (lambda n: None)
    try:
        for path in files:
            kind = detect(path) if format == "auto" else format
            if kind == "slime":
                yield from slime_records(path, tick)
            elif path.endswith(".parquet"):
                yield from _parquet(path, tick)
            else:
                yield from _jsonl(path, verl_record if kind == "verl" else validate, tick)
    finally:
        if bar is not None:
            bar.close()
