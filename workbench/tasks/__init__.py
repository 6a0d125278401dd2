"""The synthetic task with a verifiable reward (digit arithmetic), one job per module (the greedy accuracy of
a policy on it is held-out evaluation: ``workbench.experiments.evaluation``):

* ``arithmetic`` — problems, wrong answers, the reward, preference pairs;
* ``files`` — the JSONL data files in ``data/`` (train/test prompts, preference pairs);
* ``encoding`` — prompts to left-padded ids, responses to ids, decoded responses to rewards;

Everything is re-exported here: ``from workbench.tasks import rl_problems, encode_prompts`` works.
"""

from workbench.tasks.arithmetic import Problem, all_problems, make_preferences, reward, split_problems, wrong_answer
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
    read_jsonl,
    rl_problems,
    write_data_files,
    write_jsonl,
)

__all__ = [
    "Problem", "all_problems", "make_preferences", "reward", "split_problems", "wrong_answer",
    "CHAT_TEMPLATE_MODES", "prompt_ids", "uses_chat_template", "decode_responses", "encode_prompts", "encode_response",
    "score_responses",
    "TEST_PREFERENCES", "TEST_PROMPTS", "TRAIN_PREFERENCES", "TRAIN_PROMPTS", "load_preferences", "load_problems",
    "read_jsonl", "rl_problems", "write_data_files", "write_jsonl",
]
