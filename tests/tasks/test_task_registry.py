"""The task registry: names, files, max_new_tokens, checkpoints, errors; and the arithmetic task unchanged."""

import pytest

from workbench import tasks
from workbench.core.errors import ParameterError
from workbench.modeling.tiny import TRAINED_CHECKPOINTS


def test_every_task_is_registered_with_its_files_lengths_and_checkpoint():
    assert set(tasks.TASKS) == {"arith", "sums", "restate"}
    arith, sums, restate = tasks.task_info("arith"), tasks.task_info("sums"), tasks.task_info("restate")
    assert (arith.train_prompts, arith.test_prompts) == (tasks.TRAIN_PROMPTS, tasks.TEST_PROMPTS)
    assert arith.max_new_tokens == 8 and sums.max_new_tokens == 48 and restate.max_new_tokens == 16
    for info in (arith, sums, restate):
        assert info.train_prompts.exists() and info.test_prompts.exists()
        assert TRAINED_CHECKPOINTS[info.checkpoint] == info.checkpoint_folder


def test_unknown_task_names_the_valid_ones():
    with pytest.raises(ParameterError, match=r"task='sum' .*'arith', 'sums'"):
        tasks.task_info("sum")
    with pytest.raises(ParameterError, match="'arith', 'sums'"):
        tasks.reward("1", True, tasks.Problem("1+0=", "1", task="nope"))


def test_max_new_tokens_follows_the_tasks_of_the_problems():
    arith = tasks.load_problems(tasks.TEST_PROMPTS)[:3]
    sums = tasks.load_problems(tasks.task_info("sums").test_prompts)[:3]
    assert tasks.max_new_tokens_for(arith) == 8
    assert tasks.max_new_tokens_for(sums) == 48
    assert tasks.max_new_tokens_for(arith + sums) == 48


def test_arithmetic_files_are_what_make_data_writes(tmp_path, monkeypatch):
    """The arithmetic files hold ``make_data``'s split, rows of two keys (no ``task``: arithmetic is the default)."""
    train, test = tasks.split_problems()
    rows = [tasks.problem_row(p) for p in test]
    assert rows == tasks.read_jsonl(tasks.TEST_PROMPTS)
    assert [tasks.problem_row(p) for p in train[:200]] == tasks.read_jsonl(tasks.TRAIN_PROMPTS)[:200]
    assert set(rows[0]) == {"prompt", "answer"}
