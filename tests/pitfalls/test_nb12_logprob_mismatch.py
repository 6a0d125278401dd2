"""nb12_logprob_mismatch: metrics(), figures, the effect reading and the log-ratio explorer."""

import torch
from pitfall_fakes import axes, check_metrics, drew, fake_runs

from workbench.pitfalls import nb12_logprob_mismatch as rm


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


def test_figures_and_effect_lines():
    assert drew(rm.figure_mismatch(RESULTS, 1.02))
    fig, ax = axes(3)
    runs = fake_runs(rm.ppo_variants(1.02), KEYS)
    rm.plot_ppo(ax, runs, window=1)
    assert drew(fig)
    assert len(rm.effect_lines(rm.ppo_effects(runs)).splitlines()) == 8  # 6 pair sentences, 2 readings of TIS


def test_log_ratio_explorer_switches_the_sampler():
    results = {"bf16 rollout": {"log_ratio": torch.tensor([0.1, -0.2]), "max_ratio_deviation": 0.2},
               "fp32 rollout": {"log_ratio": torch.tensor([0.0, 0.0]), "max_ratio_deviation": 0.0}}
    explorer = rm.log_ratio_explorer(results)
    assert explorer.last["max_ratio_deviation"] == 0.2
    explorer.controls["rollout"].value = "fp32 rollout"
    assert explorer.last["max_ratio_deviation"] == 0.0
