"""``workbench train --task``: the task picks the training prompts, the checkpoint and the response budget
unless the command line names them; DPO on a task without shipped pairs is an exit-2 error naming the fix."""

import json

from workbench.cli.main import main
from workbench.tasks.registry import TASKS


def _history(out) -> dict:
    return json.loads((out / "history.json").read_text())


def test_grpo_on_sums_trains_the_sums_checkpoint_on_sums_prompts_with_its_budget(tmp_path):
    out = tmp_path / "sums"
    args = ["train", "grpo", "--task", "sums", "--limit", "4", "--output-dir", str(out), "--quiet",
            "--set", "steps=1", "--set", "prompts_per_step=2", "--set", "num_generations=2"]
    assert main(args) == 0
    summary = _history(out)
    assert summary["task"] == "sums" and summary["model"] == TASKS["sums"].checkpoint
    assert summary["config"]["max_new_tokens"] == TASKS["sums"].max_new_tokens == 48  # not the config's default 8


def test_an_explicit_max_new_tokens_wins_over_the_task(tmp_path):
    out = tmp_path / "sums"
    args = ["train", "grpo", "--task", "sums", "--limit", "4", "--output-dir", str(out), "--quiet", "--max_new_tokens", "12",
            "--set", "steps=1", "--set", "prompts_per_step=2", "--set", "num_generations=2"]
    assert main(args) == 0
    assert _history(out)["config"]["max_new_tokens"] == 12


def test_dpo_on_sums_without_pairs_exits_2_naming_the_fix(tmp_path, capsys):
    out = tmp_path / "dpo"
    assert main(["train", "dpo", "--task", "sums", "--output-dir", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "preference pairs for the arith task only" in err and "--data" in err
    assert not out.exists()
