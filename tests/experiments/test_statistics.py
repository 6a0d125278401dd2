"""experiments.statistics and comparison.first_divergence: an effect against the seeds' noise."""

from workbench.experiments import comparison, statistics


def test_effect_against_noise():
    flat = [{"step": i, "x": 1.0 + 0.01 * (i % 2)} for i in range(8)]
    runs = {"bug": [flat, flat, flat], "fix": [[{**h, "x": h["x"] + d} for h in flat] for d in (0.0, 0.02, -0.02)]}
    e = statistics.effect(runs, "x", "bug", "fix")
    assert e.seeds == 3 and not e.larger_than_noise and "not larger than" in e.sentence()
    runs = {"bug": [flat] * 3, "fix": [[{**h, "x": h["x"] - 1 + d} for h in flat] for d in (0.0, 0.02, -0.02)]}
    assert statistics.effect(runs, "x", "bug", "fix").larger_than_noise
    one = statistics.effect({"bug": [flat], "fix": [flat]}, "x", "bug", "fix")
    assert one.seeds == 1 and one.difference == 0 and not one.larger_than_noise and "one seed" in one.sentence()
    assert comparison.first_divergence(flat, flat, "x") is None
    assert comparison.first_divergence(flat, flat[:3] + [{"x": 5.0}] + flat[4:], "x") == 3


def test_heldout_gains_is_gain_per_label():
    def run(start, end):
        return [[{"heldout_accuracy_start": start, "heldout_accuracy": end}] for _ in range(3)]

    runs = {"bug": run(0.2, 0.2), "fix": run(0.2, 0.8)}
    assert statistics.heldout_gains(runs) == {k: vars(statistics.gain(runs, k)) for k in runs}
    assert list(statistics.heldout_gains(runs, ["fix"])) == ["fix"]
