"""The sums task: problem and response format, the reward's parsing, the lengths, the data files."""

import random

import pytest

from workbench import tasks
from workbench.core.errors import InputError
from workbench.tasks import sums

PROBLEM = sums.make_problem([3, 5, 9])


def test_problem_and_response_format():
    assert PROBLEM.prompt == "sum 3 5 9 ="
    assert PROBLEM.answer == "3 8 17 ; 17"
    assert PROBLEM.task == "sums"
    assert sums.target(PROBLEM) == "17"
    assert sums.numbers_of(PROBLEM.prompt) == [3, 5, 9]
    assert sums.make_problem([0, 99]).answer == "0 99 ; 99"
    with pytest.raises(ValueError, match="not a sums prompt"):
        sums.numbers_of("47+8=")


@pytest.mark.parametrize("text, finished, expected", [
    ("3 8 17 ; 17", True, 1.0),      # the correct scratchpad
    (" 3 8 17 ; 17 ", True, 1.0),    # spaces around are ignored
    ("; 17", True, 1.0),             # only the final answer counts (partial sums are not checked)
    ("3 8 16 ; 17", True, 1.0),
    ("3 8 17 ; 16", True, 0.0),      # wrong final answer
    ("3 8 17 ; 17", False, 0.0),     # cut off before EOS
    ("3 8 17 17", True, 0.0),        # missing marker
    ("3 8 17 ;", True, 0.0),         # nothing after the marker
    ("3 8 17 ; 17 5", True, 0.0),    # trailing garbage
    ("3 8 17 ; 17;", True, 0.0),
    ("3 8 17 ; 17 ; 17", True, 0.0),  # a second marker is trailing text after the first answer
    ("", True, 0.0),
])
def test_reward_parses_the_answer_after_the_marker(text, finished, expected):
    assert sums.reward(text, finished, PROBLEM) == expected
    assert tasks.reward(text, finished, PROBLEM) == expected  # the registry dispatches on problem.task


def test_format_term_is_off_by_default_and_rewards_the_shape_only():
    assert sums.reward("3 8 16 ; 16", True, PROBLEM) == 0.0
    assert sums.reward("3 8 16 ; 16", True, PROBLEM, format_weight=0.1) == pytest.approx(0.1)
    assert sums.reward("3 8 17 ; 17", True, PROBLEM, format_weight=0.1) == pytest.approx(1.1)
    assert sums.reward("3 8 x ; 16", True, PROBLEM, format_weight=0.1) == 0.0
    assert sums.reward("3 8 16 ; 16", False, PROBLEM, format_weight=0.1) == 0.0


def test_arithmetic_reward_is_unchanged_by_the_dispatch():
    problem = tasks.Problem("47+8=", "55")
    assert problem.task == "arith"
    assert [tasks.reward(t, f, problem) for t, f in [("55", True), (" 55 ", True), ("55", False), ("56", True)]] == [1, 1, 0, 0]
    # an arithmetic problem whose answer looks like a scratchpad is still scored by exact match
    assert tasks.reward("; 55", True, problem) == 0.0


def test_correct_responses_span_5_to_40_tokens_and_depend_on_the_problem(tokenizer):
    rng = random.Random(1)
    problems = [sums.make_problem(sums.random_numbers(rng)) for _ in range(2000)]
    extremes = [sums.make_problem([0, 0]), sums.make_problem([99] * 8)]
    counts = {}
    for p in problems + extremes:
        ids = tokenizer(p.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        assert len(ids) == sums.response_tokens(p)
        assert tokenizer.decode(ids, skip_special_tokens=True) == p.answer  # the alphabet round-trips
        assert tokenizer.unk_token_id not in tokenizer(p.prompt)["input_ids"]
        counts.setdefault(len(sums.numbers_of(p.prompt)), []).append(len(ids))
    lengths = [n for values in counts.values() for n in values]
    assert 5 <= min(lengths) and max(lengths) <= 40
    assert (min(lengths), max(lengths)) == (8, 37)
    assert sorted(counts) == list(range(2, 9))
    means = [sum(counts[k]) / len(counts[k]) for k in sorted(counts)]
    assert all(a < b for a, b in zip(means, means[1:], strict=False))  # longer lists, longer responses
    assert max(lengths) + 0 <= tasks.task_info("sums").max_new_tokens


def test_data_files_are_disjoint_loadable_and_reproducible():
    info = tasks.task_info("sums")
    train, test = tasks.load_problems(info.train_prompts), tasks.load_problems(info.test_prompts)
    assert (len(train), len(test)) == (20000, 1000)
    assert {p.task for p in train + test} == {"sums"}
    assert not {p.prompt for p in train} & {p.prompt for p in test}
    assert all(p.answer == sums.response_of(sums.numbers_of(p.prompt)) for p in test)
    assert tasks.rl_problems(5, task="sums") == train[:5]
    regenerated_train, regenerated_test = sums.split_problems()
    assert regenerated_test == test and regenerated_train[:100] == train[:100]
    assert tasks.load_problems(tasks.TRAIN_PROMPTS)[0].task == "arith"  # the arithmetic files have no task key


def test_a_data_row_with_an_unknown_task_names_file_line_and_choices(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "sum 1 2 =", "answer": "1 3 ; 3", "task": "sums"}\n{"prompt": "x", "answer": "y", "task": "summ"}\n')
    with pytest.raises(InputError, match=r"p.jsonl:2: task 'summ' .*'arith', 'sums'"):
        tasks.load_problems(path)
