"""The readers: generic Parquet equal to generic JSONL, slime's debug rollout data (written to slime's layout:
torch.save of {"rollout_id", "samples": [Sample.to_dict()]}) read without unpickling, verl's rollout_data_dir JSONL
read as text-only records, a pickled verl DataProto refused with the alternative named, and a bounded memory."""

import datetime
import json
import pickle
import tracemalloc

import pytest
import torch

from workbench.inspect import DumpError, export, gaps, inspect, synthetic
from workbench.inspect.readers import detect, read


def test_parquet_reads_as_jsonl_does(tmp_path):
    rows = list(synthetic.records("stale", steps=3, groups=4))
    from_jsonl = inspect(export.write_jsonl(rows, tmp_path / "d.jsonl"), show_progress=False)
    from_parquet = inspect(synthetic.write_parquet(rows, tmp_path / "d.parquet", batch=7), show_progress=False)
    assert from_parquet.metrics == pytest.approx(from_jsonl.metrics, rel=1e-12)
    assert [f.to_dict()["evidence"] for f in from_parquet.findings] == [f.to_dict()["evidence"] for f in from_jsonl.findings]
    assert from_parquet.findings[0].where == f"{tmp_path / 'd.parquet'}:row 0"


def _slime_sample(index, group, prompt, response, status="completed", masked_last=False):
    """A dict with the keys slime's Sample.to_dict() gives (slime/utils/types.py)."""
    return {"group_index": group, "index": index, "rollout_id": None, "prompt": "question", "tokens": prompt + response,
            "multimodal_inputs": None, "multimodal_train_inputs": None, "response": "answer",
            "response_length": len(response), "label": "4", "reward": {"score": float(index % 3)},
            "loss_mask": [1] * (len(response) - 1) + [0 if masked_last else 1], "weight_versions": ["3"],
            "rollout_log_probs": [-0.5] * len(response), "status": status, "metadata": {}, "train_metadata": None,
            "spec_info": {"spec_accept_token_num": 0}, "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 4}}


def test_slime_debug_rollout_data(tmp_path):
    samples = [_slime_sample(i, i // 4, [1, 5, 6, 7], [8, 9, 2], masked_last=True) for i in range(8)]
    samples[-1]["status"] = "truncated"
    path = tmp_path / "rollout_3.pt"
    torch.save({"rollout_id": 3, "samples": samples}, path)
    assert detect(str(path)) == "slime"
    rollouts = list(read(path, show_progress=False))
    assert [r.step for r in rollouts] == [3] * 8 and rollouts[0].group == "0" and rollouts[5].group == "1"
    assert rollouts[0].prompt_ids.tolist() == [1, 5, 6, 7] and rollouts[0].response_ids.tolist() == [8, 9, 2]
    assert rollouts[0].reward == 0.0 and rollouts[7].finish == "length" and rollouts[0].finish == "stop"
    report = inspect(path, show_progress=False)
    assert ("P8", "error") in {(f.pitfall, f.severity) for f in report.findings}  # every EOS masked out


def test_slime_file_with_arbitrary_objects_is_refused(tmp_path):
    path = tmp_path / "rollout_0.pt"
    torch.save({"rollout_id": 0, "samples": [{"tokens": [1, 2], "status": datetime.date(2026, 1, 1)}]}, path)
    with pytest.raises(DumpError, match="without unpickling arbitrary objects"):
        list(read(path, show_progress=False))


def test_verl_rollout_data_dir_is_text_only(tmp_path):
    folder = tmp_path / "rollouts"
    folder.mkdir()
    for step in (1, 2):  # verl's _write_generations: {"input", "output", "gts", "score", "step"} + reward extras
        lines = [{"input": f"q{i // 4}", "output": f"a{i}", "gts": "4", "score": 1.0, "step": step} for i in range(8)]
        (folder / f"{step}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    report = inspect(folder, show_progress=False)
    assert report.observed["text_only"] == 16 and report.observed["steps"] == 2
    assert {f.pitfall for f in report.findings} == {"P16"}  # every group's rewards equal
    assert any("pass --model" in entry["why"] for entry in report.not_observable)


def test_pickled_dataproto_is_refused_naming_the_alternative(tmp_path):
    path = tmp_path / "batch.jsonl"
    path.write_bytes(pickle.dumps({"batch": [1, 2, 3]}))
    with pytest.raises(DumpError, match="rollout_data_dir"):
        list(read(path, show_progress=False))


def test_memory_is_bounded_by_a_record_not_the_dump(tmp_path, monkeypatch):
    monkeypatch.setattr(gaps, "FLUSH_TOKENS", 512)  # the token-id buffer's bound, within these small dumps
    peaks = []
    for groups in (4, 40):  # the same steps (their per-step sums stay), 10× the responses
        path = export.write_jsonl(synthetic.records(None, steps=3, groups=groups), tmp_path / f"{groups}.jsonl")
        tracemalloc.start()
        inspect(path, show_progress=False)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 1.5 * peaks[0], peaks


def test_a_long_read_shows_a_bar(tmp_path, monkeypatch, capsys):
    from workbench.core import progress
    from workbench.inspect import readers

    monkeypatch.setattr(readers, "BAR_BYTES", 0)  # every read counts as long here
    path = export.write_jsonl(synthetic.records(None, steps=1, groups=1), tmp_path / "d.jsonl")
    with progress.hidden():
        progress.show_bars(True)
        list(read(path))
    assert "reading the dump" in capsys.readouterr().err
