"""The synthetic tasks with a verifiable reward, one job per module (the greedy accuracy of a policy on
them is held-out evaluation: ``workbench.experiments.evaluation``):

* ``arithmetic`` — digit arithmetic: problems, wrong answers, its reward, preference pairs;
* ``sums`` — running sums of a list written as a scratchpad (long, variable-length responses);
* ``restate`` — arithmetic whose responses restate the answer 0–3 times (room for truncation after the answer);
* ``registry`` — the tasks by name (``TASKS``, ``task_info``: files, ``max_new_tokens``, checkpoint) and
  the reward that scores a response by its problem's task;
* ``files`` — the JSONL data files in ``data/`` (train/test prompts, preference pairs);
* ``encoding`` — prompts to left-padded ids, responses to ids, decoded responses to rewards;

Everything is re-exported here: ``from workbench.tasks import rl_problems, encode_prompts`` works.
``reward`` here is the registry's (by task); ``tasks.arithmetic.reward`` is the arithmetic rule alone.
"""

from workbench.tasks.arithmetic import Problem, all_problems, make_preferences, split_problems, wrong_answer
from workbench.tasks.encoding import (
    CHAT_TEMPLATE_MODES,
    decode_responses,
    encode_prompts,
    encode_response,
    prompt_ids,
    score_responses,
    uses_chat_template,
)
from workbench.tasks.files import (
    TEST_PREFERENCES,
    TEST_PROMPTS,
    TRAIN_PREFERENCES,
    TRAIN_PROMPTS,
    load_preferences,
    load_problems,
    problem_row,
    read_jsonl,
    rl_problems,
    write_data_files,
    write_jsonl,
    write_restate_files,
    write_sums_files,
)
from workbench.tasks.registry import TASKS, TaskInfo, max_new_tokens_for, reward, task_info

__all__ = [
    "Problem", "all_problems", "make_preferences", "reward", "split_problems", "wrong_answer",
    "CHAT_TEMPLATE_MODES", "prompt_ids", "uses_chat_template", "decode_responses", "encode_prompts", "encode_response",
    "score_responses",
    "TEST_PREFERENCES", "TEST_PROMPTS", "TRAIN_PREFERENCES", "TRAIN_PROMPTS", "load_preferences", "load_problems",
    "problem_row", "read_jsonl", "rl_problems", "write_data_files", "write_jsonl", "write_restate_files", "write_sums_files",
    "TASKS", "TaskInfo", "max_new_tokens_for", "task_info",
]
