"""Rollout dumps: what a run sampled and scored, one record per response, written step by step as it trains.

A dump is what ``workbench inspect`` reads, brought home from any trainer. Its records are the generic format's
(``RECORD_FIELDS``): ``step``, ``group`` (responses to one prompt share it), ``prompt_ids``, ``response_ids``,
``rollout_logprobs`` (the sampler's, per response token), ``trainer_logprobs`` (the training forward's π_old),
``loss_mask``, ``reward``, ``finish`` (``stop``: the response ended on a stop token; ``length``: it hit the budget),
``temperature`` and ``policy_version`` (the step whose weights sampled it). Optional per-token fields may be None.

``RolloutDumpWriter(folder)`` writes one file per step, ``rollouts-<step>.jsonl`` (or ``.parquet``), each written whole
to a temporary name, flushed to disk and renamed: a killed run leaves every finished step and no half-written one, and
a resumed run rewrites the steps it runs again (``start(step)`` removes the files of steps from ``step`` on, which the
killed run wrote after its last checkpoint). ``step_records`` turns a trainer's padded tensors into records; ``read_dump``
reads a dump folder back in step order. Standard library and torch only (Parquet: pyarrow, loaded on use), so that
``workbench.watch``'s callback can write dumps inside other libraries' environments.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

RECORD_FIELDS = ("step", "group", "prompt_ids", "response_ids", "rollout_logprobs", "trainer_logprobs", "loss_mask",
                 "reward", "finish", "temperature", "policy_version")
FORMATS = ("jsonl", "parquet")
FINISH_REASONS = ("stop", "length", "abort")
_STEP_FILE = re.compile(r"^rollouts-(\d+)\.(jsonl|parquet)$")


class DumpError(ValueError):
    """A dump folder that cannot be written or read; the message names the path and the fix."""


def _rows(tensor) -> list:
    return tensor.detach().cpu().tolist() if isinstance(tensor, torch.Tensor) else list(tensor)


def step_records(step: int, *, prompt_ids, prompt_mask, response_ids, response_mask, reward, finished,
                 rollout_logprobs=None, trainer_logprobs=None, loss_mask=None, group_size: int = 1, group_offset: int = 0,
                 temperature: float | None = None, policy_version: int | None = None) -> list[dict]:
    """One record per row of a step's padded batch: prompts left-padded (``prompt_mask`` 0 on padding), responses
    right-padded (``response_mask`` 1 up to and including the stop token). Each response is cut to its
    ``response_mask`` length, and the per-token fields (``rollout_logprobs``, ``trainer_logprobs``, ``loss_mask``,
    shaped like ``response_ids``) with it; ``loss_mask`` None is ``response_mask``. Row ``i`` is in group
    ``group_offset + i // group_size``; ``finished`` (bool per row) gives ``finish`` ``stop`` or ``length``."""
    prompts, prompt_masks = _rows(prompt_ids), _rows(prompt_mask)
    responses, response_masks = _rows(response_ids), _rows(response_mask)
    rewards, finishes = _rows(reward), _rows(finished)
    per_token = {name: None if values is None else _rows(values)
                 for name, values in (("rollout_logprobs", rollout_logprobs), ("trainer_logprobs", trainer_logprobs),
                                      ("loss_mask", response_mask if loss_mask is None else loss_mask))}
    if not len(prompts) == len(responses) == len(rewards) == len(finishes):
        raise DumpError(f"step {step}: {len(prompts)} prompts, {len(responses)} responses, {len(rewards)} rewards and "
                        f"{len(finishes)} finish flags: every per-row input needs one entry per response")
    records = []
    for row, (prompt, kept, response, mask) in enumerate(zip(prompts, prompt_masks, responses, response_masks, strict=True)):
        length = max((i + 1 for i, m in enumerate(mask) if m), default=0)
        record = {
            "step": int(step),
            "group": int(group_offset + row // group_size),
            "prompt_ids": [int(t) for t, m in zip(prompt, kept, strict=True) if m],
            "response_ids": [int(t) for t in response[:length]],
        }
        for name, values in per_token.items():
            if values is None:
                record[name] = None
            elif name == "loss_mask":
                record[name] = [int(round(float(v))) for v in values[row][:length]]
            else:
                record[name] = [float(v) for v in values[row][:length]]
        record["reward"] = float(rewards[row])
        record["finish"] = "stop" if bool(finishes[row]) else "length"
        record["temperature"] = None if temperature is None else float(temperature)
        record["policy_version"] = None if policy_version is None else int(policy_version)
        records.append(record)
    return records


def _check_record(record: dict, where: str) -> None:
    missing = [name for name in ("step", "group", "prompt_ids", "response_ids", "reward") if record.get(name) is None]
    if missing:
        raise DumpError(f"{where}: the record lacks {', '.join(missing)}; every record needs step, group, prompt_ids, "
                        "response_ids and reward")
    length = len(record["response_ids"])
    for name in ("rollout_logprobs", "trainer_logprobs", "loss_mask"):
        values = record.get(name)
        if values is not None and len(values) != length:
            raise DumpError(f"{where}: {name} has {len(values)} values for {length} response tokens; give one per token")
    if record.get("finish") is not None and record["finish"] not in FINISH_REASONS:
        raise DumpError(f"{where}: finish={record['finish']!r}; use one of {FINISH_REASONS}")
    if not math.isfinite(float(record["reward"])):
        raise DumpError(f"{where}: reward {record['reward']!r} is not finite")


class RolloutDumpWriter:
    """Writes a dump folder step by step (see the module doc). ``format``: ``jsonl`` or ``parquet``."""

    def __init__(self, folder: str | os.PathLike, *, format: str = "jsonl"):
        if format not in FORMATS:
            raise DumpError(f"rollout dump format {format!r} is unknown; use one of {FORMATS}")
        self.folder, self.format = Path(folder), format
        if self.folder.exists() and not self.folder.is_dir():
            raise DumpError(f"--dump-rollouts {self.folder}: a file is there, not a folder; give a folder path (it is "
                            "created if missing)")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DumpError(f"--dump-rollouts {self.folder}: the folder cannot be made ({exc.strerror}); give a "
                            "writable folder path") from None
        if not os.access(self.folder, os.W_OK | os.X_OK):
            raise DumpError(f"--dump-rollouts {self.folder}: the folder is not writable; give a writable folder path")
        if format == "parquet":
            _pyarrow()
        self.steps_written = 0

    def path(self, step: int) -> Path:
        return self.folder / f"rollouts-{int(step):06d}.{self.format}"

    def start(self, step: int) -> list[Path]:
        """Before a run's first step ``step``: remove the files of steps ≥ ``step`` (a killed run's steps after its
        last checkpoint, which this run writes again) and the temporary files of an interrupted write."""
        removed = []
        for path in self.folder.iterdir():
            match = _STEP_FILE.match(path.name)
            stale = (match is not None and int(match.group(1)) >= step) or path.name.startswith(".rollouts-")
            if stale:
                path.unlink()
                removed.append(path)
        return removed

    def write_step(self, step: int, records: Sequence[dict]) -> Path:
        """Write one step's records as a whole file (temporary name, fsync, rename)."""
        for index, record in enumerate(records):
            _check_record(record, f"step {step}, record {index}")
            if record["step"] != step:
                raise DumpError(f"step {step}, record {index}: its step is {record['step']}; a file holds one step")
        final = self.path(step)
        temporary = final.with_name(f".{final.name}.tmp")
        if self.format == "jsonl":
            with open(temporary, "w", encoding="utf-8") as handle:
                handle.write("".join(json.dumps({k: record.get(k) for k in RECORD_FIELDS}, allow_nan=False) + "\n"
                                     for record in records))
                handle.flush()
                os.fsync(handle.fileno())
        else:
            pyarrow, parquet = _pyarrow()
            columns = {name: [record.get(name) for record in records] for name in RECORD_FIELDS}
            parquet.write_table(pyarrow.table(columns), temporary)
            with open(temporary, "rb") as handle:
                os.fsync(handle.fileno())
        os.replace(temporary, final)
        self.steps_written += 1
        return final


def _pyarrow():
    try:
        import pyarrow  # pyarrow: only for Parquet dumps
        import pyarrow.parquet as parquet
    except ImportError as exc:
        raise DumpError(f"a Parquet rollout dump needs pyarrow ({exc}); pip install pyarrow, or dump JSONL") from None
    return pyarrow, parquet


def dump_files(folder: str | os.PathLike) -> list[Path]:
    """A dump folder's step files, in step order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DumpError(f"{folder}: no such dump folder; give the folder a run wrote with --dump-rollouts")
    found = [(int(m.group(1)), path) for path in folder.iterdir() if (m := _STEP_FILE.match(path.name))]
    return [path for _, path in sorted(found)]


def read_dump(folder: str | os.PathLike) -> Iterator[dict]:
    """The records of a dump folder, step by step (one step file in memory at a time)."""
    for path in dump_files(folder):
        if path.suffix == ".parquet":
            _, parquet = _pyarrow()
            yield from parquet.read_table(path).to_pylist()
            continue
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DumpError(f"{path}:{number}: not a JSON record ({exc.msg}); the file is damaged") from None
