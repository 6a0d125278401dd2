"""workbench.viz.explorer: the measurement pair an explorer of a bug switch draws."""

from workbench.viz.explorer import with_switch_flipped


def test_with_switch_flipped_measures_both_sides_the_chosen_one_first():
    calls = []

    def measure(value, switch):
        calls.append((value, switch))
        return value * (10 if switch else 1)

    results = with_switch_flipped(measure, 3, True)
    assert list(results) == [(3, True), (3, False)]
    assert results == {(3, True): 30, (3, False): 3}
    assert calls == [(3, True), (3, False)]
