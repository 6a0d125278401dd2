"""The course table: every exercise module takes its entry and adds its cases to it, in course order, each case once."""

import pytest

from workbench.exercises import EXERCISES
from workbench.exercises.common import Exercise, Outcome
from workbench.exercises.course import COURSE
from workbench.exercises.registry import CASE_MODULES


def test_every_course_entry_is_its_module_exercise_with_cases():
    assert list(EXERCISES) == list(COURSE) == [m.__name__.rsplit(".", 1)[-1] for m in CASE_MODULES]
    for module in CASE_MODULES:
        assert module.EXERCISE is COURSE[module.EXERCISE.name]
        assert len(module.EXERCISE.cases) >= 2, module.__name__


def test_course_order_and_case_order():
    assert list(COURSE)[:3] == ["s1_position_ids", "s2_left_pad", "s3_mask_after_eos"]
    assert EXERCISES["p6_logprobs"].case_names == ["temperature", "values", "bf16"]
    assert EXERCISES["s2_left_pad"].case_names == ["tokens", "pad_id", "no_padding", "generation"]
    assert EXERCISES["p6_logprobs"].function == "logprobs" and EXERCISES["s3_generate"].function == "generate"


def test_add_case_as_decorator_and_call_and_twice():
    ex = Exercise("demo", signature="f(x) -> y", lesson="00_quickstart", summary="a demo")

    @ex.add_case("first", "x = 1", "1")
    def first(fn):
        return Outcome("1", True)

    ex.add_case("second", "x = 2", "2", lambda fn: Outcome("2", True))
    assert first.__name__ == "first" and ex.case_names == ["first", "second"] and ex.case("second").expected == "2"
    with pytest.raises(ValueError, match="declares case 'first' twice"):
        ex.add_case("first", "again", "again", first)
