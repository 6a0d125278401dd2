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
