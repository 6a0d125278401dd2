"""Rollout dumps in the generic format with one planted fault each (or none), for the tests, the benchmark and the
notebook that shows the inspector: ``records(fault, …)`` yields the records, ``export.write_jsonl`` or ``write_parquet`` saves them.

A clean dump: prompts opening with one BOS (id 1), responses ending with EOS (id 2) and trained up to it, 5 % cut at
``max_length`` with a fixed reward 0, trainer log-probs within N(0, 0.01²) of the sampler's (k3 KL ≈ 5e-5), rewards
that differ inside every group, every sample from the current policy. ``FAULTS`` names what each fault changes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

BOS, EOS, VOCAB = 1, 2, 1000
FAULTS = {
    "mismatch": "P12: trainer log-probs N(0, 0.3²) away from the sampler's, the EOS 1 nat away",
    "growing_gap": "P37: the gap's noise grows from 0.01 to 0.26 over the steps",
    "no_stop": "S3: 80 % of responses end at max_length",
    "after_eos": "S3: responses go on after an EOS in their middle, trained",
    "truncation_rewarded": "P11: 30 % truncated, scored like finished ones",
    "pad_eos": "P8: the final EOS of stopped responses masked out",
    "double_bos": "P21: prompts open with BOS twice",
    "prompt_in_mask": "S4: the loss mask covers the prompt",
    "near_zero_std": "P16: a third of the groups' rewards equal up to rounding (0.1 + 0.2 vs 0.3)",
    "stale": "P28: samples from policies 1–3 steps old",
}


def records(fault: str | None = None, steps: int = 6, groups: int = 8, group_size: int = 4, max_length: int = 64,
            seed: int = 0) -> Iterator[dict]:
    """``steps × groups × group_size`` generic records with ``fault`` planted (``None``: clean)."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"fault={fault!r}; use one of {sorted(FAULTS)} or None")
    rng = np.random.default_rng(seed)
    truncated_share = {"no_stop": 0.8, "truncation_rewarded": 0.3}.get(fault, 0.05)
    for step in range(steps):
        noise = 0.01 + 0.05 * step if fault == "growing_gap" else (0.3 if fault == "mismatch" else 0.01)
        for group in range(groups):
            base = float(rng.random())
            near_zero = fault == "near_zero_std" and group % 3 == 0
            for member in range(group_size):
                prompt = [BOS] + ([BOS] if fault == "double_bos" else []) + rng.integers(3, VOCAB, int(rng.integers(4, 12))).tolist()
                truncated = not near_zero and rng.random() < truncated_share
                length = max_length if truncated else int(rng.integers(2, max_length))
                response = rng.integers(3, VOCAB, length).tolist()
                if not truncated:
                    response[-1] = EOS
                if fault == "after_eos" and length > 4:
                    response[length // 2] = EOS
                sampled = -np.abs(rng.gumbel(0.5, 0.5, length))
                trained = sampled + rng.normal(0.0, noise, length)
                if fault == "mismatch" and not truncated:
                    trained[-1] = sampled[-1] - 1.0
                mask = [1] * length
                if fault == "pad_eos" and not truncated:
                    mask[-1] = 0
                if fault == "prompt_in_mask":
                    mask = [1] * len(prompt) + mask
                if near_zero:
                    reward = 0.1 + 0.2 if member % 2 else 0.3
                elif truncated and fault != "truncation_rewarded":
                    reward = 0.0
                else:
                    reward = round(base + float(rng.random()) + 0.01 * member, 6)
                yield {"step": step, "group": f"{step}-{group}", "prompt_ids": prompt, "response_ids": response,
                       "rollout_logprobs": sampled.round(6).tolist(), "trainer_logprobs": trained.round(6).tolist(),
                       "loss_mask": mask, "reward": reward, "finish": "length" if truncated else "stop", "temperature": 1.0,
                       "policy_version": step - (1 + member % 3 if fault == "stale" else 0)}


def write_parquet(rows, path, batch: int = 1024) -> str:
    """Generic records as Parquet, one row group per ``batch`` rows (the reader holds one row group at a time)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer, chunk = None, []
    for row in itertools.chain(rows, [None]):
        if row is not None:
            chunk.append(row)
        if chunk and (row is None or len(chunk) >= batch):
            table = pa.Table.from_pylist(chunk)
            writer = writer or pq.ParquetWriter(str(path), table.schema)
            writer.write_table(table.cast(writer.schema))
            chunk = []
    if writer is not None:
        writer.close()
    return str(path)
