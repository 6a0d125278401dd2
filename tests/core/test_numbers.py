"""``workbench.core.numbers``: a number, or "n/a (<why>)" with the reason a statistic is undefined — never "nan"."""

import math

from workbench.core.numbers import NO_SPREAD, NOT_MEASURED, ONE_SEED, as_number, is_undefined, shown, shown_field, why_undefined


def test_shown_formats_a_number_and_names_why_one_is_undefined():
    assert shown(0.123456) == "0.123" and shown(3, ".2f") == "3.00" and shown(-0.5, "+.2g") == "-0.5"
    assert shown(float("nan")) == f"n/a ({NOT_MEASURED})" and shown("nan", why=ONE_SEED) == "n/a (one seed: no noise estimate)"
    assert shown(float("inf"), why="overflow") == "n/a (overflow)" and shown("text") == "text"
    assert as_number(True) is None and as_number("1.5") == 1.5 and as_number(None) is None
    assert is_undefined("nan") and is_undefined(float("-inf")) and not is_undefined(0.0) and not is_undefined("name")


def test_the_reason_follows_the_record():
    assert why_undefined("se", {"seeds": 1}) == ONE_SEED == why_undefined("prediction.mde", {"seeds": 1})
    assert why_undefined("threshold", {"seeds": 1}) == ONE_SEED and why_undefined("mde", {"seeds": 3, "se": 0.0}) == NO_SPREAD
    assert why_undefined("effects.reward.mde", {"seeds": 1, "noise": 0.0}) == NO_SPREAD  # one seed, a flat difference
    assert why_undefined("training.reward_end_std_over_seeds", {}) == "one seed: no spread over seeds"
    assert why_undefined("mde", {"seeds": 3, "se": 0.1}) == NOT_MEASURED and why_undefined("effect", {"seeds": 1}) == NOT_MEASURED
    assert shown_field("mde", {"mde": math.nan, "seeds": 1}) == "n/a (one seed: no noise estimate)"
    assert shown_field("mde", {"mde": 0.0123, "seeds": 3}) == "0.0123"
