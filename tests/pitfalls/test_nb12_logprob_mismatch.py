"""nb12_logprob_mismatch: metrics(), figures, the effect reading and the log-ratio explorer."""

import pytest
import torch
from pitfall_fakes import axes, check_metrics, drew, fake_runs

from workbench.core import losses
from workbench.experiments.checkpoints import load
from workbench.pitfalls import nb12_logprob_mismatch as rm
from workbench.pitfalls import nb12_logprob_mismatch as rollout_mismatch
from workbench.tasks import rl_problems
from workbench.trainers.ppo import PPOConfig, PPOTrainer


def result(spread: float, clipped: float) -> dict:
    log_ratio = torch.tensor([spread, -spread, 0.0])
    return {"log_ratio": log_ratio, "max_ratio_deviation": float(log_ratio.exp().sub(1).abs().max()),
            "mean_abs_log_ratio": float(log_ratio.abs().mean()), "tis_clipped_fraction": clipped}


RESULTS = {"bf16 rollout": result(0.05, 0.3), "fp32 rollout": result(0.0, 0.0)}
KEYS = ("reward", "kl", "first_ratio_deviation")


def test_metrics_returns_write_metrics_arguments():
    runs = fake_runs(rm.ppo_variants(1.02), KEYS)
    kwargs = rm.metrics(results=RESULTS, runs=runs, effects=rm.ppo_effects(runs), settings={})
    check_metrics(kwargs, "12_logprob_mismatch")
    assert kwargs["reproduced"] and kwargs["fixed"] and kwargs["not_shown"] is None
    assert "log_ratio" not in kwargs["metrics"]["bf16 rollout"]  # tensors stay out of metrics.json
    assert set(kwargs["metrics"]["ppo_effects"]) == {"reward vs fp32 rollout", "heldout_accuracy vs fp32 rollout",
                                                     "reward vs bf16 rollout + TIS", "heldout_accuracy vs bf16 rollout + TIS",
                                                     "reward: fp32 rollout vs bf16 rollout + TIS",
                                                     "heldout_accuracy: fp32 rollout vs bf16 rollout + TIS"}


def test_figures_and_training_lines():
    assert drew(rm.figure_mismatch(RESULTS, 1.02))
    fig, ax = axes(3)
    runs = fake_runs(rm.ppo_variants(1.02), KEYS)
    rm.plot_ppo(ax, runs, window=1)
    assert drew(fig)
    lines = rm.training_lines(rm.ppo_effects(runs), runs, "arith").splitlines()
    assert lines[0].startswith("Prediction, fixed before the run (arith)") and lines[1].startswith("Outcome: ")
    assert [line.split()[0] for line in lines[-2:]] == ["reward:", "heldout_accuracy:"]  # one reading of TIS per measure
    assert not any("±" in line for line in lines[-2:])  # the noise is said in words; its numbers are in the table


def test_log_ratio_explorer_switches_the_sampler():
    results = {"bf16 rollout": {"log_ratio": torch.tensor([0.1, -0.2]), "max_ratio_deviation": 0.2},
               "fp32 rollout": {"log_ratio": torch.tensor([0.0, 0.0]), "max_ratio_deviation": 0.0}}
    explorer = rm.log_ratio_explorer(results)
    assert explorer.last["max_ratio_deviation"] == 0.2
    explorer.controls["rollout"].value = "fp32 rollout"
    assert explorer.last["max_ratio_deviation"] == 0.0


PROMPTS = [p.prompt for p in rl_problems(32)]


def test_p12_bf16_rollout_mismatch_and_tis(qwen):
    model, tokenizer = qwen
    bf16 = rollout_mismatch.rollout_vs_trainer(model, tokenizer, PROMPTS, sampler_precision="bf16", cap=1.05)
    fp32 = rollout_mismatch.rollout_vs_trainer(model, tokenizer, PROMPTS, sampler_precision="fp32")
    assert bf16["max_ratio_deviation"] > 1e-2 and fp32["max_ratio_deviation"] < 1e-4
    assert bf16["tis_max_weight"] <= 1.05
    torch.testing.assert_close(losses.tis_weights(torch.tensor([0.0, 1.0]), torch.tensor([0.0, 0.0]), 2.0), torch.tensor([1.0, 2.0]))


def test_p12_ppo_tis_needs_recomputed_old_logprobs():
    from workbench.core.errors import ConfigError

    with pytest.raises(ConfigError, match="recompute"):
        PPOConfig(tis_cap=2.0, old_logprobs="rollout")
    model, tokenizer = load("tiny-arith-qwen2")
    config = PPOConfig(steps=1, sampler_precision="bf16", old_logprobs="recompute", tis_cap=2.0, progress=False,
                       prompts_per_step=8, mini_batches=1)
    step = PPOTrainer(model, tokenizer, rl_problems(16), config).train()[0]
    assert step["first_ratio_deviation"] > 1e-3 and step["train_ratio_deviation"] < 1e-4


def test_rollout_mismatch_verdict_needs_tis_to_act():
    fp32 = {"max_ratio_deviation": 0.0}
    assert rollout_mismatch.verdict({"bf16 rollout": {"max_ratio_deviation": 1e-5, "tis_clipped_fraction": 0.1},
                                     "fp32 rollout": fp32}) == (False, True)
    assert rollout_mismatch.verdict({"bf16 rollout": {"max_ratio_deviation": 0.2, "tis_clipped_fraction": 0.0},
                                     "fp32 rollout": fp32}) == (True, False)  # a cap above every ratio does nothing
    log_ratio = torch.log(torch.tensor([1.0, 1.1, 1.3, 0.9]))
    assert rollout_mismatch.clipped_fraction_by_cap(log_ratio, [1.05, 1.2, 2.0]) == [0.5, 0.25, 0.0]


def test_tis_reading_calls_tis_a_repair_only_after_a_measured_harm():
    from workbench.experiments.statistics import Effect
    from workbench.pitfalls import nb12_logprob_mismatch as rm

    def e(diff, larger, bug=0.4, fix=0.4):
        return Effect("heldout_accuracy", bug, fix, diff, 0.003, 3, larger)

    assert "not a repair" in rm.tis_reading(e(-0.004, False), e(-0.015, True, 0.435, 0.45), e(-0.011, True))
    assert "does not change" in rm.tis_reading(e(-0.05, True), e(0.001, False), e(0.05, True))
    assert "brings it to the fp32" in rm.tis_reading(e(-0.05, True), e(-0.05, True), e(0.0, False))
    assert "not to the fp32" in rm.tis_reading(e(-0.05, True), e(-0.02, True), e(0.03, True))
