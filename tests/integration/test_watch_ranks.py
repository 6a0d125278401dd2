"""The watch across 2 real processes (torchrun, gloo on the CPU), one test per entry point: ``train --watch``, the
``WatchCallback`` on TRL's SFTTrainer, and ``python -m workbench watch -- torchrun …``. Each plants a bug on rank 1
only — a no-grad forward of the model in training mode (P7) — and keeps each rank's own report; rank 0's report must
hold both ranks' observations: the planted finding, and every counter equal to the sum of the ranks' own counters.

``assert_holds_both_ranks`` is that check; each test also runs it on rank 0's report with rank 1's dropped (rank 0's
own part merged alone: what a merge that lost rank 1 would give) and requires it to fail, so a merge that dropped
rank 1's report fails these tests. ~30-60 s each on 2 shared cores: slow.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.watch.report import Report

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("torchrun", path=str(BIN)) is None, reason="torchrun is not installed")]
COUNTERS = ("forwards", "training_forwards", "no_grad_forwards", "optimizer_steps")


def pitfalls(report: dict) -> set[str]:
    return {finding["pitfall"] for finding in report["findings"]}


def assert_holds_both_ranks(merged: dict, own: list[dict], planted: str = "P7") -> None:
    """``merged`` (rank 0's report) holds the observations of both ranks, whose own reports are ``own``."""
    assert planted not in pitfalls(own[0]) and planted in pitfalls(own[1]), "the bug is planted on rank 1 only"
    assert planted in pitfalls(merged), f"rank 1's {planted} is missing from rank 0's report"
    for counter in COUNTERS:
        assert merged["observed"].get(counter, 0) == sum(part["observed"].get(counter, 0) for part in own), counter
    assert sum(part["observed"]["forwards"] for part in own) > own[0]["observed"]["forwards"] > 0


def assert_fails_with_rank_1_dropped(own: list[dict]) -> None:
    """The check above rejects rank 0's report when rank 1's part never reached the merge."""
    dropped = Report.merge([Report.from_dict(own[0])]).to_dict()
    with pytest.raises(AssertionError):
        assert_holds_both_ranks(dropped, own)


def torchrun(*args: str) -> list[str]:
    return [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", *args]


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


TRAIN_ON_RANKS = '''
"""python -m workbench train …, with rank 1's policy left in training mode (P7 planted there only); each rank's own
watch report goes to rank<R>.json before the ranks' reports are merged."""
import json, os, sys
from pathlib import Path
import workbench.cli.train as train
import workbench.trainers.base as base
from workbench.cli.main import main

rank = int(os.environ["RANK"])
if rank == 1:
    switch = base.apply_dropout_switch
    base.apply_dropout_switch = lambda models, disable: switch(models, False)
merge = train.merged

def keep_own(report):
    Path(f"rank{rank}.json").write_text(json.dumps(report.to_dict()))
    return merge(report)

train.merged = keep_own
sys.exit(main(sys.argv[1:]))
'''


def test_train_watch_merges_both_ranks(tmp_path):
    (tmp_path / "train_on_ranks.py").write_text(TRAIN_ON_RANKS)
    out = tmp_path / "run"
    run(torchrun("train_on_ranks.py", "train", "grpo", "--watch", "--limit", "8", "--set", "steps=2", "--set",
                 "prompts_per_step=2", "--set", "num_generations=2", "--quiet", "--output-dir", str(out)), tmp_path)
    own = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    merged = json.loads((out / "report.json").read_text())
    assert merged["observed"]["ranks"] == 2
    assert_holds_both_ranks(merged, own)
    assert_fails_with_rank_1_dropped(own)


TRL_ON_RANKS = '''
"""TRL's SFTTrainer with a WatchCallback on 2 ranks; rank 1 alone runs a no-grad check forward in training mode (P7)."""
import json, os, sys
import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import SFTConfig, SFTTrainer
from workbench.modeling.tiny import tiny_model
from workbench.watch import WatchCallback

rank = int(os.environ["RANK"])
model, tokenizer = tiny_model("gpt2", seed=1)


class CheckForwardInTrainMode(TrainerCallback):
    def on_step_end(self, args, state, control, model=None, **kwargs):
        model.train()
        with torch.no_grad():
            model(input_ids=torch.tensor([[5, 6, 7, 8]]))


watch = WatchCallback()
args = SFTConfig(output_dir=sys.argv[1], use_cpu=True, bf16=False, report_to="none", logging_steps=1, max_steps=2,
                 per_device_train_batch_size=2, save_strategy="no", dataset_text_field="text", max_length=16)
rows = [{"text": text} for text in ["1+2=3", "12+34=46", "3*4=12", "56-7=49"]] * 2
trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                     callbacks=[watch] + ([CheckForwardInTrainMode()] if rank == 1 else []))
trainer.train()
with open(f"rank{rank}.json", "w") as handle:
    json.dump(watch.watch.report().to_dict(), handle)
'''


def test_watch_callback_on_trl_merges_both_ranks(tmp_path):
    pytest.importorskip("trl")
    (tmp_path / "trl_on_ranks.py").write_text(TRL_ON_RANKS)
    out = tmp_path / "sft"
    run(torchrun("trl_on_ranks.py", str(out)), tmp_path)
    own = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    merged = json.loads((out / "report.json").read_text())
    assert merged["observed"]["ranks"] == 2 and own[0]["observed"]["optimizer_steps"] == 2
    assert_holds_both_ranks(merged, own)
    assert_fails_with_rank_1_dropped(own)


SCRIPT_ON_RANKS = '''
"""A user's DDP script (no workbench in it but the tiny model): rank 1 alone runs a no-grad forward in training mode."""
import torch
import torch.distributed as dist
from workbench.modeling.tiny import tiny_model

dist.init_process_group("gloo")
model, _ = tiny_model("gpt2", seed=1)
model.train()
trained = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.tensor([[1, 2, 3, 4], [2, 3, 4, 5]])
for step in range(2):
    trained(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if dist.get_rank() == 1:
        with torch.no_grad():
            model(input_ids=ids)
dist.destroy_process_group()
'''


def test_watch_command_over_torchrun_merges_both_ranks(tmp_path):
    (tmp_path / "script_on_ranks.py").write_text(SCRIPT_ON_RANKS)
    out = tmp_path / "watched"
    command = [sys.executable, "-m", "workbench", "watch", "--out", str(out), "--", *torchrun("script_on_ranks.py")]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode in (0, 1), done.stderr[-4000:]  # 1: the planted finding is an error (dropout on)
    parts = {rank: sorted((out / "parts").glob(f"rank{rank}-*.json")) for rank in (0, 1)}
    assert [len(found) for found in parts.values()] == [1, 1], sorted(p.name for p in (out / "parts").iterdir())
    own = [json.loads(parts[rank][0].read_text()) for rank in (0, 1)]
    merged = json.loads((out / "report.json").read_text())
    assert merged["observed"]["processes"] == 2 and own[0]["observed"]["optimizer_steps"] == 0  # the optimiser: not watched here
    assert_holds_both_ranks(merged, own)
    assert_fails_with_rank_1_dropped(own)
