"""Every training notebook's module states the consequence its mechanism predicts (``PREDICTION``) and records it in
``metrics["prediction"]`` with the keys of ``RECORD_KEYS``, from the measured effect — never from a typed verdict."""

import pytest
from pitfall_fakes import fake_runs

from workbench.experiments import statistics
from workbench.pitfalls import nb01_position_ids as nb01
from workbench.pitfalls import nb03_eos_termination as nb03
from workbench.pitfalls import nb04_dpo_loss_mask as nb04
from workbench.pitfalls import nb05_grpo_loss_normalization as nb05
from workbench.pitfalls import nb06_temperature as nb06
from workbench.pitfalls import nb07_dropout as nb07
from workbench.pitfalls import nb11_truncated_responses as nb11
from workbench.pitfalls import nb12_logprob_mismatch as nb12
from workbench.pitfalls import nb13_whitening as nb13

RECORD_KEYS = {"consequence", "direction", "effect", "se", "threshold", "mde", "larger", "seeds", "task"}

# module, its effects from runs, the run labels (bug first), the history keys the runs record
CASES = {
    "01": (nb01, nb01.ppo_effects, list(nb01.PPO_VARIANTS), ("reward", "kl", "heldout_accuracy")),
    "03": (nb03, nb03.ppo_effects, list(nb03.PPO_VARIANTS), ("reward", "tokens_generated")),
    "04": (nb04, nb04.training_effects, ["chosen_only", "both"], ("logps/prompt", "rewards/margins", "heldout_accuracy")),
    "05": (nb05, lambda runs: nb05.training_effects(runs, ["token-mean", "seq-mean-token-mean"]),
           ["token-mean", "seq-mean-token-mean"], ("length_incorrect", "reward", "heldout_accuracy")),
    "06": (nb06, nb06.ppo_effects, list(nb06.PPO_VARIANTS), ("clip_fraction", "reward", "heldout_accuracy")),
    "07": (nb07, nb07.ppo_effects, list(nb07.PPO_VARIANTS), ("reward", "heldout_accuracy")),
    "11": (nb11, nb11.training_effects, [nb11.BUG, nb11.REFERENCE], ("finished_fraction", "heldout_accuracy")),
    "12": (nb12, lambda runs: nb12.prediction_effects(nb12.ppo_effects(runs)), [nb12.BUG, nb12.FP32, nb12.TIS],
           ("reward", "heldout_accuracy")),
    "13": (nb13, nb13.ppo_effects, list(nb13.PPO_VARIANTS), ("advantage_mean_real_tokens", "reward", "heldout_accuracy")),
}


@pytest.mark.parametrize("notebook", sorted(CASES))
def test_the_prediction_is_recorded_from_the_measured_effect(notebook):
    module, effects_of, labels, keys = CASES[notebook]
    assert isinstance(module.PREDICTION, statistics.Prediction) and module.PREDICTION.direction in ("+", "-")
    effects = effects_of(fake_runs(labels, keys, seeds=3))
    record = module.PREDICTION.record(effects, "sums")
    assert RECORD_KEYS <= set(record) and record["task"] == "sums" and record["seeds"] == 3
    measured = effects[module.PREDICTION.measure]
    assert record["effect"] == pytest.approx(measured.difference) and record["mde"] == pytest.approx(measured.threshold * measured.noise)
    assert record["agrees"] == (measured.larger_than_noise and (measured.difference > 0) == (module.PREDICTION.direction == "+"))
    assert module.PREDICTION.sentence(effects, "sums").startswith("predicted on sums: ")
