"""``core.rollout_dump``: records cut from a trainer's padded tensors, one whole file per step, bad folders refused."""

import json
import os

import pytest
import torch

from workbench.core.rollout_dump import RECORD_FIELDS, DumpError, RolloutDumpWriter, dump_files, read_dump, step_records


def batch():
    """Two rows, group size 2: row 0 stops on its third token (id 2), row 1 hits the budget of 4 tokens."""
    return dict(
        prompt_ids=torch.tensor([[0, 5, 6], [7, 8, 9]]), prompt_mask=torch.tensor([[0, 1, 1], [1, 1, 1]]),
        response_ids=torch.tensor([[3, 4, 2, 0], [3, 3, 3, 3]]), response_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),
        rollout_logprobs=torch.tensor([[-0.5, -1.0, -0.1, 0.0], [-2.0, -0.25, -0.75, -1.5]]),
        trainer_logprobs=torch.tensor([[-0.5, -1.25, -0.1, 0.0], [-2.0, -0.25, -0.5, -1.5]]),
        loss_mask=torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]),
        reward=torch.tensor([1.0, 0.0]), finished=torch.tensor([True, False]),
    )


def test_records_are_cut_to_each_response_and_keep_every_value():
    first, second = step_records(3, **batch(), group_size=2, temperature=0.7, policy_version=2)
    assert list(first) == list(RECORD_FIELDS)
    assert first == {"step": 3, "group": 0, "prompt_ids": [5, 6], "response_ids": [3, 4, 2],
                     "rollout_logprobs": [-0.5, -1.0, pytest.approx(-0.1)],
                     "trainer_logprobs": [-0.5, -1.25, pytest.approx(-0.1)], "loss_mask": [1, 1, 0], "reward": 1.0,
                     "finish": "stop", "temperature": pytest.approx(0.7), "policy_version": 2}
    assert second["prompt_ids"] == [7, 8, 9] and second["response_ids"] == [3, 3, 3, 3] and second["group"] == 0
    assert second["finish"] == "length" and second["trainer_logprobs"] == [-2.0, -0.25, -0.5, -1.5]
    assert step_records(0, **batch())[1]["group"] == 1  # group size 1: one group per row


def test_a_dump_round_trips_in_both_formats(tmp_path):
    pytest.importorskip("pyarrow")
    for fmt in ("jsonl", "parquet"):
        writer = RolloutDumpWriter(tmp_path / fmt, format=fmt)
        written = [step_records(step, **batch(), group_size=2) for step in range(3)]
        for step, records in enumerate(written):
            writer.write_step(step, records)
        assert [p.name for p in dump_files(tmp_path / fmt)] == [f"rollouts-00000{i}.{fmt}" for i in range(3)]
        assert list(read_dump(tmp_path / fmt)) == [r for records in written for r in records]


def test_a_failed_write_leaves_no_step_file_and_a_restart_clears_what_a_killed_run_left(tmp_path, monkeypatch):
    writer = RolloutDumpWriter(tmp_path)
    writer.write_step(0, step_records(0, **batch()))
    writer.write_step(1, step_records(1, **batch()))

    def killed(*args):
        raise OSError("killed during fsync")

    monkeypatch.setattr(os, "fsync", killed)
    with pytest.raises(OSError):
        writer.write_step(2, step_records(2, **batch()))
    monkeypatch.undo()
    assert [p.name for p in dump_files(tmp_path)] == ["rollouts-000000.jsonl", "rollouts-000001.jsonl"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [".rollouts-000002.jsonl.tmp"]
    assert all(len(json.loads(line)) == len(RECORD_FIELDS) for p in dump_files(tmp_path) for line in p.open())
    # a run resumed from its checkpoint of step 1 writes steps 1… again: their old files and the temporary one go
    removed = RolloutDumpWriter(tmp_path).start(1)
    assert sorted(p.name for p in removed) == [".rollouts-000002.jsonl.tmp", "rollouts-000001.jsonl"]
    assert [r["step"] for r in read_dump(tmp_path)] == [0, 0]


def test_bad_folders_and_records_are_refused_naming_them(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(DumpError, match="a-file: a file is there, not a folder"):
        RolloutDumpWriter(blocker)
    with pytest.raises(DumpError, match="cannot be made"):
        RolloutDumpWriter(blocker / "below")
    with pytest.raises(DumpError, match="format 'csv' is unknown"):
        RolloutDumpWriter(tmp_path / "d", format="csv")
    writer = RolloutDumpWriter(tmp_path / "d")
    record = step_records(0, **batch())[0]
    with pytest.raises(DumpError, match="step 0, record 0: trainer_logprobs has 2 values for 3 response tokens"):
        writer.write_step(0, [{**record, "trainer_logprobs": [0.0, 0.0]}])
    with pytest.raises(DumpError, match="its step is 0; a file holds one step"):
        writer.write_step(1, [record])
    with pytest.raises(DumpError, match="finish='eos'"):
        writer.write_step(0, [{**record, "finish": "eos"}])
    (tmp_path / "d" / "rollouts-000000.jsonl").write_text('{"step": 0\n')
    with pytest.raises(DumpError, match=r"rollouts-000000.jsonl:1: not a JSON record"):
        list(read_dump(tmp_path / "d"))
    with pytest.raises(DumpError, match="no such dump folder"):
        dump_files(tmp_path / "absent")
