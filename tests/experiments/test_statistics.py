"""experiments.statistics and comparison.first_divergence: an effect against the seeds' noise."""

import json
import math

import pytest

from workbench.core.errors import ParameterError
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
    def run(start, end):  # seeds that differ a little (an identical gain in every seed has NaN for its MDE: NaN != NaN)
        return [[{"heldout_accuracy_start": start, "heldout_accuracy": end + 0.01 * i}] for i in range(3)]

    runs = {"bug": run(0.2, 0.2), "fix": run(0.2, 0.8)}
    assert statistics.heldout_gains(runs) == {k: vars(statistics.gain(runs, k)) for k in runs}
    assert list(statistics.heldout_gains(runs, ["fix"])) == ["fix"]


def test_bug_fix_by_setting_reads_each_side_of_a_sweep():
    results = {(0.5, False): {"gap": 3.0}, (0.5, True): {"gap": 0.0}, (2, False): {"gap": 7.0}, (2, True): {"gap": 1.0}}
    entry = statistics.bug_fix_by_setting(results, [0.5, 2], "gap")
    assert entry == {"gap_bug": {"0.5": 3.0, "2": 7.0}, "gap_fix": {"0.5": 0.0, "2": 1.0}}
    assert list(entry) == ["gap_bug", "gap_fix"]


def _diffs_effect(diffs):
    """An effect whose paired per-seed differences (bug − fix) are ``diffs``."""
    runs = {"bug": [[{"x": d}] for d in diffs], "fix": [[{"x": 0.0}] for _ in diffs]}
    return statistics.effect(runs, "x", "bug", "fix")


def test_minimum_detectable_effect_by_hand():
    # differences 1, 2, 3: std 1 → s.e. 1/√3; t(2 dof) = 4.303 → MDE 4.303/√3 = 2.484; the mean 2 is below it
    e = _diffs_effect([1.0, 2.0, 3.0])
    assert math.isclose(e.noise, 1 / math.sqrt(3)) and math.isclose(e.threshold, 4.303)
    assert math.isclose(e.mde, 4.303 / math.sqrt(3)) and math.isclose(e.mde, 2.4843, abs_tol=1e-4)
    assert not e.larger_than_noise and vars(e)["mde"] == e.mde  # metrics store vars(Effect): the MDE goes with it
    assert e.sentence("tokens").endswith("not larger than seed noise — no effect larger than 2.5 tokens could be seen")
    clear = _diffs_effect([2.0, 2.1, 2.2])  # s.e. 0.0577 → MDE 0.248 < 2.1
    assert clear.larger_than_noise and math.isclose(clear.mde, 4.303 * 0.1 / math.sqrt(3))
    assert clear.sentence().endswith("= 0.25): larger than seed noise") and "no effect larger" not in clear.sentence()
    one = _diffs_effect([1.0])  # one value per run: no noise estimate
    assert math.isnan(one.mde) and "without a noise estimate" in one.sentence()
    # an Effect built by hand derives its MDE from threshold × noise
    assert math.isclose(statistics.Effect("k", 1.0, 0.0, 1.0, 0.5, 3, False, threshold=4.303).mde, 2.1515)
    assert math.isnan(statistics.Effect("k", 1.0, 0.0, 1.0, 0.5, 3, False).mde)  # no threshold, no MDE


def test_prediction_record():
    e = _diffs_effect([2.0, 2.1, 2.2])
    record = statistics.prediction(e, "length of wrong answers grows", "+", "scratchpad")
    assert set(record) == {"consequence", "direction", "effect", "se", "threshold", "mde", "larger", "seeds", "task",
                           "measure", "agrees"}
    assert record["consequence"] == "length of wrong answers grows" and record["task"] == "scratchpad"
    assert record["direction"] == "+" and record["seeds"] == 3 and record["measure"] == "x"
    assert math.isclose(record["effect"], 2.1) and math.isclose(record["se"], 0.1 / math.sqrt(3))
    assert math.isclose(record["threshold"], 4.303) and math.isclose(record["mde"], e.mde)
    assert record["larger"] is True and record["agrees"] is True
    json.dumps(record, allow_nan=False)  # JSON-safe
    opposite = statistics.prediction(e, "length of wrong answers shrinks", "-", "scratchpad")
    assert opposite["larger"] is True and opposite["agrees"] is False  # larger, but the sign is the other one
    null = statistics.prediction(_diffs_effect([1.0, 2.0, 3.0]), "c", "+", "arith")
    assert null["larger"] is False and null["agrees"] is False  # right sign, not larger: no agreement
    nan = statistics.prediction(_diffs_effect([1.0]), "c", "+", "arith")
    assert nan["se"] == "nan" and nan["mde"] == "nan" and nan["agrees"] is False
    json.dumps(nan, allow_nan=False)


def test_prediction_with_a_bad_direction_names_it_and_the_fix():
    with pytest.raises(ParameterError, match=r"direction='up'.*'\+'.*'-'"):
        statistics.prediction(_diffs_effect([1.0, 2.0, 3.0]), "c", "up", "arith")


def test_prediction_sentence_states_the_prediction_the_measurement_and_a_verdict_chosen_by_the_numbers():
    from workbench.experiments.statistics import Effect, prediction, prediction_sentence, prediction_verdict

    def record(difference, noise, direction="+"):
        effect = Effect(key="length_incorrect", bug=difference, fix=0.0, difference=difference, noise=noise, seeds=3,
                        larger_than_noise=abs(difference) > 4.303 * noise, threshold=4.303)
        return prediction(effect, "length of incorrect responses", direction, "sums")

    agrees = record(2.0, 0.1)
    assert prediction_verdict(agrees) == ("as predicted", "larger, as predicted")
    line = prediction_sentence(agrees, unit="tokens")
    assert line.startswith("predicted on sums: length of incorrect responses, bug − fix > 0; measured +2 ± 0.1 tokens")
    assert "needs > 4.30 s.e. = 0.43 tokens" in line and line.endswith("larger, as predicted")
    assert prediction_verdict(record(-2.0, 0.1))[0] == "opposite"
    null = record(0.2, 0.1, direction="-")
    assert prediction_verdict(null) == ("null", "no effect > 0.43")
    assert "bug − fix < 0" in prediction_sentence(null) and prediction_sentence(null).endswith("no effect > 0.43")


def test_a_prediction_object_reads_its_measure_from_the_effects():
    import pytest

    from workbench.core.errors import ParameterError
    from workbench.experiments.statistics import Effect, Prediction

    effect = Effect(key="kl", bug=0.5, fix=0.1, difference=0.4, noise=0.05, seeds=3, larger_than_noise=True, threshold=4.303)
    predicted = Prediction("kl", "logged KL to the reference", "+", unit="nats")
    record = predicted.record({"kl": effect, "reward": effect}, "arith")
    assert record["measure"] == "kl" and record["agrees"] is True and record["task"] == "arith"
    assert predicted.sentence({"kl": effect}, "arith").endswith("larger, as predicted")
    with pytest.raises(KeyError, match="'kl' is not among the effects"):
        predicted.record({"reward": effect}, "arith")
    with pytest.raises(ParameterError, match="use '\\+'"):
        Prediction("kl", "x", "up")


# ---- what a training cell prints ----
def _effect(difference, noise, seeds=3, larger=None, threshold=4.303, names=("bug", "fix")):
    larger = abs(difference) > threshold * noise if larger is None else larger
    return statistics.Effect(key="m", bug=1.0 + difference, fix=1.0, difference=difference, noise=noise, seeds=seeds,
                             larger_than_noise=larger, threshold=threshold, names=names)


def test_plain_verdict_says_the_distance_in_standard_errors_and_the_power():
    larger = statistics.plain_verdict(_effect(2.2, 0.4), "tokens")
    assert larger.startswith("larger than seed noise: the effect, +2.2 tokens, is 5.5 standard errors from 0 over 3 seeds")
    assert "needs more than 4.30" in larger
    null = statistics.plain_verdict(_effect(-0.02, 0.02))
    assert null.startswith("not larger than seed noise") and "1.0 standard errors" in null
    assert "could see an effect of 0.086 or more" in null  # 4.303 × 0.02
    assert statistics.plain_verdict(_effect(0.5, 0.0)).startswith("not testable")
    assert "nan" not in statistics.plain_verdict(_effect(0.5, float("nan"), seeds=1)).lower()
    one_seed = statistics.plain_verdict(_effect(0.1, 0.1, seeds=1, threshold=2.0))
    assert one_seed.startswith("not larger than the noise") and "1 steps" not in one_seed and "this run could see" in one_seed


def test_effects_table_prints_a_dash_and_a_reason_for_undefined_numbers():
    table = statistics.effects_table({"reward": _effect(-0.02, 0.02), "one seed": _effect(0.1, float("nan"), seeds=1)})
    header, reward, one_seed = table.splitlines()
    assert header.split()[:3] == ["measure", "bug", "fix"]
    assert reward.split()[-2:] == ["not", "larger"] and "0.086" in reward
    assert "—" in one_seed and one_seed.endswith("not tested (one seed)") and "nan" not in table


def test_training_summary_states_the_prediction_then_its_outcome_then_the_table():
    effects = {"m": _effect(2.2, 0.4, names=("seq-mean", "token-mean"))}
    runs = {"seq-mean": [[{"step": 0, "heldout_accuracy_start": 0.5, "heldout_accuracy": 0.6}]] * 3,
            "token-mean": [[{"step": 0, "heldout_accuracy_start": 0.5, "heldout_accuracy": 0.55}]] * 3}
    prediction = statistics.Prediction("m", "longer wrong answers", "+", "tokens")
    lines = statistics.training_summary(effects, runs, prediction, "sums").splitlines()
    assert lines[0] == "Prediction, fixed before the run (sums): longer wrong answers, the bug's value above the fix's."
    assert lines[1].startswith("Outcome: larger than seed noise") and lines[1].endswith("as predicted.")
    held_out = lines.index(next(line for line in lines if line.startswith("held-out accuracy")))
    assert lines[held_out].split()[2:5] == ["start", "end", "gain"]
    assert lines[held_out + 1].split()[:4] == ["seq-mean", "0.5", "0.6", "+0.1"]
    assert lines[-1].startswith("(bug − fix: seq-mean − token-mean;")
    opposite = statistics.training_summary({"m": _effect(-2.2, 0.4)}, runs, prediction, "sums").splitlines()[1]
    assert opposite.endswith("opposite to the prediction.")


def test_one_seed_sentences_say_why_the_noise_is_undefined_never_nan():
    one = _diffs_effect([1.0])
    assert "± n/a (one seed: no noise estimate)" in one.sentence() and "nan" not in one.sentence()
    record = statistics.prediction(one, "wrong answers grow longer", "+", "sums")
    sentence = statistics.prediction_sentence(json.loads(json.dumps(record)), "tokens")  # as read from metrics.json
    assert sentence == ("predicted on sums: wrong answers grow longer, bug − fix > 0; measured +1 ± n/a (one seed: no noise "
                        "estimate) (1 seed(s), one seed: no noise estimate): no effect seen (no noise estimate)")
