"""The restate task: response format, the first-answer reward, the restatement draw, the lengths, the data files."""

import collections

import pytest

from workbench import tasks
from workbench.tasks import arithmetic, restate

PROBLEM = restate.make_problem("47+8=", "55", 2)


def test_problem_and_response_format():
    assert PROBLEM.prompt == "47+8=" and PROBLEM.answer == "55 55 55" and PROBLEM.task == "restate"
    assert restate.target(PROBLEM) == "55"
    assert restate.response_of("-7", 0) == "-7" and restate.response_of("-7", 3) == "-7 -7 -7 -7"
    assert [restate.restatement_count(t) for t in ("55", "55 55 55", "", " 55  55 ")] == [0, 2, 0, 1]
    with pytest.raises(ValueError, match="restatements=-1"):
        restate.response_of("5", -1)


@pytest.mark.parametrize("text, finished, expected", [
    ("55", True, 1.0),             # stated once
    ("55 55 55", True, 1.0),       # restated: still the first answer
    (" 55 ", True, 1.0),           # spaces around are ignored
    ("55 54", True, 1.0),          # what follows the first answer is not read (lenient extraction)
    ("55 55 5", True, 1.0),
    ("54 55", True, 0.0),          # the first answer is wrong
    ("055", True, 1.0),            # an integer: 055 == 55
    ("55x", True, 0.0),            # the first field is not an integer
    ("-", True, 0.0),
    ("", True, 0.0),
    ("55 55 55", False, 0.0),      # cut off before EOS
    ("55", False, 0.0),
])
def test_reward_reads_the_first_answer_of_a_finished_response(text, finished, expected):
    assert restate.reward(text, finished, PROBLEM) == expected
    assert tasks.reward(text, finished, PROBLEM) == expected  # the registry dispatches on problem.task


def test_negative_answers_and_the_arithmetic_rule_unchanged():
    negative = restate.make_problem("3-9=", "-6", 1)
    assert restate.reward("-6 -6", True, negative) == 1.0 and restate.reward("6 -6", True, negative) == 0.0
    assert restate.first_answer("-6 x") == "-6" and restate.first_answer("6-") is None
    # the arithmetic task still asks for exactly the answer: a restated one scores 0 there
    assert tasks.reward("55 55", True, arithmetic.Problem("47+8=", "55")) == 0.0


def test_lengths_span_2_to_16_tokens_and_round_trip(tokenizer):
    train, test = restate.split_problems()
    extremes = [restate.make_problem("1*0=", "0", 0), restate.make_problem("0-99=", "-99", 3)]
    assert [restate.response_tokens(p) for p in extremes] == [2, 16]
    # the data's own lengths: (answer characters + 1) × (restatements + 1) for answers of 1-3 characters, 0-3 restatements
    assert {restate.response_tokens(p) for p in train + test} == {2, 3, 4, 6, 8, 9, 12, 16}
    lengths = []
    for p in test:
        ids = tokenizer(p.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        assert len(ids) == restate.response_tokens(p)
        assert tokenizer.decode(ids, skip_special_tokens=True) == p.answer
        lengths.append(len(ids))
    assert (min(lengths), max(lengths)) == (2, 16) == (2, tasks.task_info("restate").max_new_tokens)


def test_data_files_are_the_arithmetic_split_restated_reproducibly():
    info = tasks.task_info("restate")
    train, test = tasks.load_problems(info.train_prompts), tasks.load_problems(info.test_prompts)
    arith_train, arith_test = arithmetic.split_problems()
    assert [p.prompt for p in train] == [p.prompt for p in arith_train]
    assert [p.prompt for p in test] == [p.prompt for p in arith_test]
    assert {p.task for p in train + test} == {"restate"}
    assert all(restate.target(r) == a.answer for r, a in zip(train + test, arith_train + arith_test, strict=True))
    assert all(r.answer == restate.response_of(a.answer, restate.restatement_count(r.answer))
               for r, a in zip(test, arith_test, strict=True))
    assert restate.split_problems() == (train, test)
    # the draw follows RESTATEMENT_WEIGHTS (18,090 train problems: each share within 0.015 of its weight)
    counts = collections.Counter(restate.restatement_count(p.answer) for p in train)
    assert set(counts) == set(restate.RESTATEMENTS)
    for k, w in zip(restate.RESTATEMENTS, restate.RESTATEMENT_WEIGHTS, strict=True):
        assert abs(counts[k] / len(train) - w) < 0.015, (k, counts[k] / len(train))


@pytest.mark.parametrize("task, answer, message", [
    ("restate", "x 55", r"p.jsonl:2: the restate answer 'x 55' does not start with an integer"),
    ("restate", "", r"p.jsonl:2: the restate answer '' does not start with an integer"),
    ("sums", "3 8 17", r"p.jsonl:2: the sums answer '3 8 17' has no integer after the marker ';'"),
    ("sums", "3 8 ; x", r"p.jsonl:2: the sums answer '3 8 ; x' has no integer after the marker"),
])
def test_a_data_row_whose_answer_the_task_cannot_score_names_file_line_and_fix(tmp_path, task, answer, message):
    """Caught when the file is read, not as an IndexError or ValueError in the middle of a training run's scoring."""
    import json

    from workbench.core.errors import InputError

    path = tmp_path / "p.jsonl"
    good = {"prompt": "1+1=", "answer": "2 2", "task": "restate"} if task == "restate" else {
        "prompt": "sum 1 2 =", "answer": "1 3 ; 3", "task": "sums"}
    path.write_text(json.dumps(good) + "\n" + json.dumps({"prompt": good["prompt"], "answer": answer, "task": task}) + "\n")
    with pytest.raises(InputError, match=message) as exc:
        tasks.load_problems(path)
    assert "e.g." in str(exc.value)
    assert tasks.load_problems(_one_row(tmp_path, good))[0].task == task  # the same row with a scorable answer loads


def _one_row(tmp_path, row):
    import json

    path = tmp_path / "ok.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return path
