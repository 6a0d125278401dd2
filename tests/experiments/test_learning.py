"""Learning settings, held-out evaluation and the learning / step-0 verdicts of ``workbench.experiments.comparison``."""

import math

import matplotlib
import pytest

from workbench.experiments import comparison, statistics
from workbench.viz import plots

matplotlib.use("Agg")


def _runs(starts, ends, steps=4):
    """One history per seed whose last record carries held-out accuracy start → end."""
    runs = []
    for start, end in zip(starts, ends, strict=True):
        history = [{"step": i, "x": float(i)} for i in range(steps)]
        history[-1].update(heldout_accuracy_start=start, heldout_accuracy=end, heldout_gain=end - start)
        runs.append(history)
    return runs


def test_learning_settings_are_one_table_with_overrides():
    grpo = comparison.learning_settings("grpo")
    assert grpo == comparison.LEARNING_SETTINGS["grpo", "notebook"] and grpo["learning_rate"] <= 2e-5
    assert comparison.learning_settings("ppo", "full")["steps"] == 60
    assert comparison.learning_settings("grpo", steps=3)["steps"] == 3
    assert comparison.LEARNING_SETTINGS["grpo", "notebook"]["steps"] != 3  # the table is not edited by an override
    with pytest.raises(ValueError, match="kind must be"):
        comparison.learning_settings("dpo")


def test_gain_larger_than_seed_noise_only_when_it_is():
    runs = {"up": _runs([0.40, 0.40, 0.40], [0.44, 0.45, 0.43]), "flat": _runs([0.40, 0.40, 0.40], [0.42, 0.38, 0.41])}
    up, flat = statistics.gain(runs, "up"), statistics.gain(runs, "flat")
    assert up.larger_than_noise and math.isclose(up.difference, 0.04) and math.isclose(up.noise, 0.01 / math.sqrt(3))
    assert up.bug == pytest.approx(0.44) and up.fix == pytest.approx(0.40)
    assert "end 0.44, start 0.4" in up.sentence() and up.sentence().endswith("= 0.025): larger than seed noise")
    assert "s.e. over 3 seeds; 95 % needs |effect| > 4.30 s.e." in up.sentence()
    assert not flat.larger_than_noise and "not larger than" in flat.sentence()
    one = statistics.gain({"a": _runs([0.4], [0.5])}, "a")
    assert one.seeds == 1 and not one.larger_than_noise  # one seed: no noise estimate, never "larger"
    assert statistics.learning_sentence(runs).count("\n") == 1
    with pytest.raises(ValueError, match="held_out"):
        statistics.gain({"a": [[{"step": 0, "x": 1.0}]]}, "a")


def test_an_effect_without_spread_is_not_called_larger():
    """Every seed moved held-out accuracy by exactly the same amount (a discrete metric: the same prompts flipped): the
    s.e. is 0, so the t threshold has nothing to scale and the verdict is not "larger" (as notebook 11 can measure: +0.005 ± 0)."""
    same = statistics.gain({"a": _runs([0.5, 0.5, 0.5], [0.75, 0.75, 0.75])}, "a")
    assert same.noise == 0 and same.difference == 0.25 and not same.larger_than_noise and same.no_spread
    assert math.isnan(same.mde)  # no detectable-effect size: not "no effect > 0"
    assert "every seed gave the same difference" in same.sentence() and "not testable" in same.sentence()
    record = statistics.prediction(same, "held-out accuracy", "+", "arith")
    assert record["larger"] is False and record["agrees"] is False and record["mde"] == "nan"
    assert statistics.prediction_verdict(record) == ("null", "not testable: no spread over seeds (s.e. 0)")
    assert "s.e. 0: no spread" in statistics.prediction_sentence(record) and "= 0" not in statistics.prediction_sentence(record)
    # equal differences whose std rounds to ~1.4e-16 rather than 0 (the mean of three 0.7s): still no spread, never "larger"
    repeated = statistics.gain({"a": _runs([0.0, 0.0, 0.0], [0.7, 0.7, 0.7])}, "a")
    assert repeated.no_spread and not repeated.larger_than_noise and math.isnan(repeated.mde)


def test_effect_at_start_separates_a_step0_gap_from_learning():
    # the bug starts 0.5 higher and the gap closes: present at step 0, absent at the end
    bug = [[{"step": i, "r": 0.5 * (i == 0) + 0.01 * s} for i in range(8)] for s in range(3)]
    fix = [[{"step": i, "r": 0.01 * s + (0.001 * s if i == 0 else (0.0, 0.004, -0.004)[s])} for i in range(8)] for s in range(3)]
    runs = {"bug": bug, "fix": fix}
    start, end = statistics.effect(runs, "r", "bug", "fix", at="start"), statistics.effect(runs, "r", "bug", "fix")
    assert start.key == "r at step 0" and start.difference == pytest.approx(0.499) and start.larger_than_noise
    assert not end.larger_than_noise and abs(end.difference) < 0.01
    assert not statistics.effect({"bug": bug[:1], "fix": fix[:1]}, "r", "bug", "fix", at="start").larger_than_noise
    with pytest.raises(ValueError, match="at="):
        statistics.effect(runs, "r", "bug", "fix", at="middle")


def test_plot_heldout_draws_start_and_end_per_variant():
    import matplotlib.pyplot as plt

    runs = {"bug": _runs([0.4, 0.4], [0.41, 0.43]), "fix": _runs([0.4, 0.4], [0.45, 0.46])}
    fig, ax = plt.subplots()
    plots.plot_heldout(ax, runs, {"bug": "red", "fix": "blue"})
    assert len(ax.get_xticks()) == 2 and len(ax.collections) >= 4  # seed dots (and error bars) for start and end of each
    plt.close(fig)


def test_train_variants_on_all_prompts_records_held_out_accuracy():
    import torch

    torch.set_num_threads(2)
    runs = comparison.train_variants("grpo", "tiny-arith-qwen2", {"a": {}}, problems=None, held_out=16,
                                     **comparison.learning_settings("grpo", steps=1, prompts_per_step=2, num_generations=2))
    last = runs["a"][0][-1]
    assert 0 <= last["heldout_accuracy_start"] <= 1 and 0 <= last["heldout_accuracy"] <= 1
    assert last["heldout_gain"] == pytest.approx(last["heldout_accuracy"] - last["heldout_accuracy_start"])
    assert "heldout_accuracy" not in runs["a"][0][0] or len(runs["a"][0]) == 1
    assert torch.get_num_threads() == 2  # the tiny model ran on one thread; the caller's setting is back


def test_drift_of_a_key_against_seed_noise():
    rising = [[{"step": i, "x": i * (0.1 + 0.001 * s) + 0.01 * s} for i in range(8)] for s in range(3)]  # slopes differ a little
    wobbling = [[{"step": i, "x": (0.05, -0.05, 0.0)[s] * (i > 0)} for i in range(8)] for s in range(3)]
    runs = {"up": rising, "flat": wobbling}
    up = statistics.drift(runs, "up", "x")
    assert up.larger_than_noise and up.fix == pytest.approx(0.01) and up.bug == pytest.approx(6.5 * 0.101 + 0.01)
    assert not statistics.drift({"same": [rising[0]] * 3}, "same", "x").larger_than_noise  # no spread: nothing to test against
    assert not statistics.drift(runs, "flat", "x").larger_than_noise
    assert not statistics.drift({"one": rising[:1]}, "one", "x").larger_than_noise  # one seed: no noise estimate


def test_train_variants_dpo_returns_the_first_seeds_models():
    import torch

    runs, models = comparison.train_variants("dpo", "tiny-arith-qwen2", {"both": {"prompt_mask": "both"}}, steps=1, seeds=(0, 1),
                                             problems=8, held_out=8, batch_size=4, return_models=True)
    assert len(runs["both"]) == 2 and "logps/prompt" in runs["both"][0][0] and "heldout_accuracy" in runs["both"][1][-1]
    chosen = statistics.gain(runs, "both", "heldout_logp_chosen")
    assert chosen.seeds == 2 and chosen.fix < 0 and chosen.key == "heldout_logp_chosen, both"
    assert set(models) == {"both"} and isinstance(models["both"], torch.nn.Module)
    with pytest.raises(ValueError, match="kind="):
        comparison.train_variants("sft", "tiny-arith-qwen2", {"a": {}}, steps=1)


def test_dpo_heldout_explanation_is_chosen_by_the_numbers():
    from workbench.pitfalls import nb04_dpo_loss_mask as dpo_mask

    def e(difference, larger):
        return statistics.Effect("k", 0.4 + difference, 0.4, difference, 0.005, 3, larger, ("end", "start"))

    text = dpo_mask.heldout_explanation(e(-0.1, True), e(-0.3, True), e(-2.0, True))
    assert "chosen (correct) answers themselves became less likely" in text and "the rejected faster" in text
    assert "no change in held-out accuracy" in dpo_mask.heldout_explanation(e(-0.004, False), e(-0.3, True), e(-2.0, True))
    assert "without the chosen answers losing" in dpo_mask.heldout_explanation(e(-0.1, True), e(0.01, False), e(-2.0, True))


def test_grad_accumulation_widget_redraws_the_notebooks_figure():
    import torch

    from workbench.pitfalls.nb10_grad_accumulation import grad_accumulation_explorer

    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]])
    errors = {"per_micro_batch": [0.0, 0.2, 0.4], "global": [0.0, 1e-7, 2e-7]}
    explorer = grad_accumulation_explorer(mask, [1, 2, 4], errors)
    assert explorer.last["error_bug"] == 0.4 and explorer.last["tokens"] == [2, 4, 1, 3]
    explorer.controls["micro_batches"].value = 2
    assert explorer.last["error_bug"] == 0.2 and explorer.last["error_fix"] == 1e-7 and explorer.renders == 2


def test_learnt_gap_separates_a_step0_gap_from_learning():
    def run(start, end, wobble):
        return [{"step": i, "r": start if i == 0 else end + wobble} for i in range(8)]

    present_from_start = {"bug": [run(0.0, 0.0, w) for w in (0.0, 0.01, -0.01)], "fix": [run(0.5, 0.5, 0.0)] * 3}
    e = statistics.learnt_gap(present_from_start, "r", "bug", "fix")
    assert e.fix == pytest.approx(-0.5) and e.bug == pytest.approx(-0.5) and not e.larger_than_noise
    learnt = {"bug": [run(0.0, -0.3, w) for w in (0.0, 0.01, -0.01)], "fix": [run(0.0, 0.0, 0.0)] * 3}
    e = statistics.learnt_gap(learnt, "r", "bug", "fix")
    assert e.difference == pytest.approx(-0.3) and e.larger_than_noise and "final gap -0.3, step-0 gap 0" in e.sentence()


def test_train_variants_with_dropout_on_is_reproducible():
    from functools import partial

    from workbench.pitfalls.nb07_dropout import set_dropout

    kwargs = dict(steps=1, seeds=(0,), problems=8, prompts_per_step=4, mini_batches=1, max_new_tokens=4,
                  before=partial(set_dropout, p=0.1))
    variants = {"dropout on": {"disable_dropout": False}}
    a = comparison.train_variants("ppo", "tiny-arith-gpt2", variants, **kwargs)
    b = comparison.train_variants("ppo", "tiny-arith-gpt2", variants, **kwargs)
    assert a["dropout on"][0][0]["train_ratio_deviation"] == b["dropout on"][0][0]["train_ratio_deviation"] > 1e-3


def test_three_seeds_need_the_t_value_not_two_standard_errors():
    # paired differences 0.02, 0.03, 0.04: mean 0.03, s.e. 0.00577 → 5.2 s.e.: larger; 0.01, 0.03, 0.05: 2.6 s.e.: not
    # larger at t(2 dof) = 4.30, although it would pass a "2 s.e." rule
    def runs(diffs):
        return {"bug": [[{"x": d}] for d in diffs], "fix": [[{"x": 0.0}] for _ in diffs]}

    assert statistics.t_critical(3) == pytest.approx(4.303) and statistics.t_critical(50) == 1.96
    assert math.isnan(statistics.t_critical(1)) and statistics.t_critical(14) == pytest.approx(2.160, abs=0.03)
    clear = statistics.effect(runs([0.02, 0.03, 0.04]), "x", "bug", "fix")
    borderline = statistics.effect(runs([0.01, 0.03, 0.05]), "x", "bug", "fix")
    assert clear.larger_than_noise and clear.threshold == pytest.approx(4.303)
    assert not borderline.larger_than_noise and "not larger than seed noise" in borderline.sentence()
    assert statistics.effect(runs([0.01, 0.03, 0.05]), "x", "bug", "fix", factor=2.0).larger_than_noise


def test_bands_on_a_log_axis_keep_exact_zeros_visible_and_say_so():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {"bug": [[{"x": v * (s + 1)} for v in (0.1, 0.01, 0.5, 0.0)] for s in range(3)],
            "fix": [[{"x": 0.0} for _ in range(4)] for _ in range(3)]}
    fig, (log_ax, linear_ax) = plt.subplots(1, 2)
    plots.plot_bands(log_ax, runs, "x", "ratio", log=True)
    plots.plot_bands(linear_ax, runs, "x", "ratio", window=2)
    assert log_ax.get_yscale() == "log" and log_ax.get_ylabel() == "ratio (mean; band: min–max over seeds)"
    # the floor: a power of ten two decades under the smallest positive mean (0.02 → 1e-4), and both zeros said
    assert [t.get_text() for t in log_ax.texts] == ["bug: ≤ 0 at 1/4 points, drawn on this line",
                                                   "fix: exactly 0 at every step, drawn on this line"]
    fix_line = log_ax.get_lines()[1]
    assert (fix_line.get_ydata() == 1e-4).all()  # drawn at the floor, not lost on the log axis
    assert "exactly 0, drawn at 1e-04" in fix_line.get_label() and "under bug at 1/4 points" in fix_line.get_label()
    assert linear_ax.get_ylabel() == "ratio (mean ± std over seeds, 2-step moving average)" and not linear_ax.texts
    plt.close(fig)
