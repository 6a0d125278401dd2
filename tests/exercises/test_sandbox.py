"""The sandbox: the learner's code in a child interpreter; a hang, an exception, a wrong type or a print is one case's 0."""

import time

from workbench.exercises import grade, solution_source

NASTY = '''
def grpo_loss(per_token_loss, mask):
    print("debugging output on stdout must not break the grader")
    if mask.shape[0] == 3:        # the empty-rows case: an infinite loop
        while True:
            pass
    if mask.shape[0] == 5:        # the values case: an exception
        raise ValueError("boom")
    if mask.shape[0] == 2:        # the gradient case: a wrong return type
        return [1.0]
    lengths = mask.sum(-1)
    return ((per_token_loss * mask).sum(-1) / lengths.clamp_min(1)).mean()
'''


def test_hang_exception_and_wrong_type_are_each_a_zero_with_a_message():
    start = time.perf_counter()
    result = grade("s5_grpo_loss", NASTY, time_limit_s=3)
    cases = {c.name: c for c in result.cases}
    assert cases["aggregation"].passed  # the cases before and after the hang still run
    assert "time limit" in cases["empty_rows"].got
    assert "raised ValueError: boom (your line 8" in cases["values"].got
    assert "returned list" in cases["gradient"].got
    assert result.score == 0.25
    assert time.perf_counter() - start < 120


def test_solution_scores_one_through_the_sandbox():
    result = grade("p9_k3", solution_source("p9_k3"))
    assert result.passed and result.score == 1.0, result.feedback
