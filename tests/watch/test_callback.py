"""``WatchCallback`` inside TRL 1.16's own trainers (one step each, CPU, tiny models): GRPO's training forward
passes no position ids on left-padded prompts (S1: an error on GPT-2's learned positions, a warning on Llama's
rotary ones); DPO masks the prompt on both sides of every pair (no S4, the pair check did run); the counters
reach the trainer's logs and the report lands in the output folder; the hooks
go at train end."""

import json
import os
import tempfile
from pathlib import Path

import pytest

from workbench.modeling.models import save
from workbench.modeling.tiny import tiny_model
from workbench.watch import WatchCallback

pytest.importorskip("trl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS = ["1+2=", "12+34=", "3*4=", "567-8="]  # different lengths: TRL pads them on the left
PAIRS = [{"prompt": "1+2=", "chosen": "3", "rejected": "4"}, {"prompt": "12+34=", "chosen": "46", "rejected": "406"},
         {"prompt": "3*4=", "chosen": "12", "rejected": "7"}, {"prompt": "56-7=", "chosen": "49", "rejected": "-1"}]
CPU = dict(use_cpu=True, bf16=False, report_to="none", logging_steps=1, max_steps=1)


def grpo_step(arch: str, callback: WatchCallback, **settings):
    from datasets import Dataset  # datasets, trl: optional (the peers extra)
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = tiny_model(arch, seed=1)
    args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="watch-grpo-"), per_device_train_batch_size=8, num_generations=2,
                      max_completion_length=6, beta=0.0, **{**CPU, **settings})
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions], args=args,
                          train_dataset=Dataset.from_list([{"prompt": prompt} for prompt in PROMPTS] * 4), processing_class=tokenizer,
                          callbacks=[callback])
    trainer.train()
    return trainer


@pytest.mark.parametrize("arch, severity", [("gpt2", "error"), ("llama", "warning")])
def test_trl_grpo_step_flags_s1_by_position_encoding(arch, severity):
    callback = WatchCallback()
    trainer = grpo_step(arch, callback)
    report = callback.report()
    s1 = [finding for finding in report.findings if finding.pitfall == "S1"]
    assert s1 and {finding.severity for finding in s1} == {severity}, str(report)
    assert s1[0].evidence["left_padded_rows"] > 0 and "grpo_trainer.py" in s1[0].where
    assert report.observed["generate_calls"] == 1 and report.observed["training_forwards"] >= 1
    logged = trainer.state.log_history[0]
    assert logged["watch/S1"] == 1 and logged["watch/errors"] == (1 if severity == "error" else 0)
    saved = json.loads(Path(trainer.args.output_dir, "report.json").read_text())
    assert saved == report.to_dict() and Path(callback.paths[1]).read_text().count("S1") >= 1
    trainer.model(input_ids=trainer.model.dummy_inputs["input_ids"][:, :4])  # detached at train end: not counted
    assert callback.report().observed["forwards"] == report.observed["forwards"]


def test_trl_dpo_step_has_no_s4():
    from datasets import Dataset  # datasets, trl: optional (the peers extra)
    from trl import DPOConfig, DPOTrainer

    model, tokenizer = tiny_model("gpt2", seed=1)
    folder = str(save(model, tokenizer, Path(tempfile.mkdtemp(prefix="watch-dpo-model-"))))  # TRL reloads its reference from here
    callback = WatchCallback(deep=True)
    args = DPOConfig(output_dir=tempfile.mkdtemp(prefix="watch-dpo-"), per_device_train_batch_size=4, beta=0.1, **CPU)
    DPOTrainer(model=folder, args=args, train_dataset=Dataset.from_list(PAIRS), processing_class=tokenizer, callbacks=[callback]).train()
    report = callback.report()
    assert "S4" not in report.pitfalls() and not report.errors, str(report)
    assert report.observed["paired_forwards"] >= 1  # the pair check ran on TRL's chosen-then-rejected forward



@pytest.mark.slow  # a TRL GRPO step with two trackers: ~8 s of CPU
def test_the_counters_reach_trackio_and_wandb_through_report_to(tmp_path, monkeypatch):
    pytest.importorskip("trackio")
    pytest.importorskip("wandb")
    from tracker_history import point_trackio_at, trackio_history, wandb_history

    point_trackio_at(tmp_path / "trackio", monkeypatch)
    for variable, value in (("WANDB_MODE", "offline"), ("WANDB_DIR", str(tmp_path)), ("WANDB_SILENT", "true"),
                            ("WANDB_PROJECT", "callback")):
        monkeypatch.setenv(variable, value)
    callback = WatchCallback()
    trainer = grpo_step("gpt2", callback, report_to=["trackio", "wandb"], project="callback", run_name="watched",
                        trackio_static_space_id=False)
    import wandb

    wandb.finish()  # transformers leaves the W&B run open until the process ends; a script's end finishes it
    history = trainer.state.log_history  # the step's log, then the training summary's: each carries the counters
    assert len(history) == 2 and history[0]["watch/S1"] == 1 and history[0]["watch/errors"] == 1
    for tracked in (trackio_history("callback", "watched"), wandb_history(tmp_path)):
        rows = [tracked[step] for step in sorted(tracked) if "train/watch/forwards" in tracked[step]]  # TRL's profiling aside
        assert len(rows) == len(history)
        for row, logged in zip(rows, history, strict=True):
            watched = {key: value for key, value in logged.items() if key.startswith("watch/")}
            assert len(watched) > 5 and {key: row[f"train/{key}"] for key in watched} == watched  # transformers adds train/
