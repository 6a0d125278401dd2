"""11: the truncation verdict weighs the shift against its noise over the mixed groups of the batch."""

from workbench.pitfalls import nb11_truncated_responses as truncation


def measured(bug_gaps, ref_gaps):
    def m(gaps):
        return {"pressure": sum(gaps) / len(gaps), "group_gaps": gaps, "mixed_groups": len(gaps)}
    return {truncation.BUG: m(bug_gaps), truncation.REFERENCE: m(ref_gaps), "masked out of the loss": {"pressure": 0.0}}


def test_consistent_shift_is_reproduced_with_its_standard_error():
    data = measured([0.30, 0.32, 0.28, 0.31, 0.29], [-0.1, -0.1, -0.1, -0.1, -0.1])
    value, se, n = truncation.shift_noise(data)
    assert n == 5 and abs(value - 0.4) < 1e-9 and 0 < se < 0.01
    assert truncation.verdict(data) == (True, True)  # reference −0.1 and masked 0: no fix favours truncation
    assert "larger than 2 s.e." in truncation.conclusion(data)


def test_shift_within_noise_is_not_reproduced():
    data = measured([1.0, -0.8, 0.9, -0.7, 0.1], [0.0] * 5)  # mean shift 0.1 > 0.05, s.e. ≈ 0.37
    assert truncation.verdict(data)[0] is False
    assert "within the sampling noise" in truncation.conclusion(data)


def test_without_group_gaps_the_threshold_alone_decides():
    data = {truncation.BUG: {"pressure": 0.4, "mixed_groups": 3}, truncation.REFERENCE: {"pressure": 0.0}}
    assert truncation.shift_noise(data)[1] != truncation.shift_noise(data)[1]  # NaN
    assert truncation.verdict(data)[0] is True
