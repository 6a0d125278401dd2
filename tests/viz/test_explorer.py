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


def test_switch_explorer_redraws_both_sides_and_keeps_the_readers():
    import ipywidgets as widgets

    from workbench.viz.explorer import switch_explorer

    drawn = []
    explorer = switch_explorer(lambda x, fix: (x, fix), lambda ax, results: drawn.append(results), title="t",
                               value=("x", widgets.FloatSlider(value=0.5)), switch=("fix", widgets.Checkbox(value=False)))
    assert explorer.last == (0.5, False) and drawn[-1] == {(0.5, False): (0.5, False), (0.5, True): (0.5, True)}
    explorer.controls["fix"].value = True
    assert explorer.last == (0.5, True) and list(drawn[-1]) == [(0.5, True), (0.5, False)]
