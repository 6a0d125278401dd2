"""nb09_kl_estimators: metrics(), figures and the estimator-gradient explorer."""

import torch
from pitfall_fakes import check_metrics, drew

from workbench.modeling.perturbation import perturbed_copy
from workbench.modeling.rollout import sample
from workbench.pitfalls import nb09_kl_estimators as kl
from workbench.pitfalls import nb09_kl_estimators as kl_estimators
from workbench.tasks import encode_prompts, rl_problems

SCALES = [0.1, 0.2]
VALUES = {s: {"exact_kl": s / 10, **{k: {"bias": 0.0 if k != "k2" else 0.01 * s, "std": 0.1, "mean": s / 10} for k in kl.ESTIMATORS}}
          for s in SCALES}
GRADIENTS = {s: {n: {"cosine": 1.0 if n != "k1 in loss" else 0.0, "norm_ratio": 1.0 if n != "k1 in loss" else 1e-5}
                 for n in kl.GRADIENT_VARIANTS} for s in SCALES}


def test_metrics_returns_write_metrics_arguments():
    kwargs = kl.metrics(values=VALUES, gradients=GRADIENTS, noise_scales=SCALES)
    check_metrics(kwargs, "09_kl_estimators")
    assert kwargs["reproduced"] and kwargs["fixed"]
    assert kwargs["metrics"]["k1_in_loss_gradient_norm_ratio"] == 1e-5 and kwargs["headline"]["fix"] == 1.0
    assert set(kwargs["metrics"]["bias"]) == set(kl.ESTIMATORS)


def test_figures_draw():
    assert drew(kl.figure_values(VALUES))
    assert drew(kl.figure_gradients(VALUES, GRADIENTS))
    assert "k2 bias +2.0e-03" in kl.values_line(VALUES, 0.2)
    nearest, farthest = kl.values_lines(VALUES).splitlines()
    assert nearest.startswith("nearest: exact KL 0.0100") and farthest.startswith("farthest: exact KL 0.0200")
    assert "k1 in loss: cosine undefined (no gradient), norm ratio 1.00e-05" in kl.gradient_lines(GRADIENTS, 0.2)


def test_kl_estimator_gradient_explorer_follows_the_distance():
    gradients = {0.1: {n: {"cosine": 1.0, "norm_ratio": 1.0} for n in kl.GRADIENT_VARIANTS},
                 0.2: {n: {"cosine": 0.5, "norm_ratio": 1.0} for n in kl.GRADIENT_VARIANTS}}
    explorer = kl.kl_estimator_gradient_explorer(SCALES, {0.1: {"exact_kl": 0.01}, 0.2: {"exact_kl": 0.1}}, gradients)
    assert explorer.last["k2 in loss"]["cosine"] == 0.5
    explorer.controls["scale_index"].value = 0
    assert explorer.last["k2 in loss"]["cosine"] == 1.0


PROMPTS = [p.prompt for p in rl_problems(32)]


def test_p9_estimator_values_and_gradients(qwen):
    reference, tokenizer = qwen
    policy = perturbed_copy(reference, 0.02, seed=0)
    generator = torch.Generator().manual_seed(0)
    ids, mask = encode_prompts(tokenizer, PROMPTS[:8])
    rollout = sample(policy, ids, mask, max_new_tokens=4, eos_token_id=2, pad_token_id=0, generator=generator)
    seq, seq_mask = rollout.sequences()
    positions = torch.nonzero(rollout.response_mask.bool())
    positions[:, 1] += ids.shape[1] - 1
    values = kl_estimators.value_stats(policy, reference, seq, seq_mask, positions)
    assert abs(values["k1"]["bias"]) < 1e-5 and abs(values["k3"]["bias"]) < 1e-5 and values["k2"]["bias"] > 1e-3
    grads = kl_estimators.gradient_comparison(policy, reference, seq, seq_mask, positions)
    assert grads["k1 in loss"]["norm_ratio"] < 1e-4  # the bug: no gradient at all
    assert grads["k2 in loss"]["cosine"] > 0.999 and grads["k1 in reward"]["cosine"] > 0.999
    assert grads["k3 in loss"]["cosine"] < 0.999  # a different objective (forward KL)


def test_kl_verdict_is_about_gradients_not_identities():
    good = {"cosine": 1.0, "norm_ratio": 1.0}
    values = {0.1: {"k2": {"bias": 0.01}}}
    no_bug = {0.1: {"k1 in loss": {"cosine": 0.2, "norm_ratio": 0.3}, "k1 in reward": good, "k2 in loss": good}}
    assert kl_estimators.verdict(values, no_bug) == (False, True)
    wrong = {0.1: {"k1 in loss": {"cosine": 0.0, "norm_ratio": 1e-8}, "k1 in reward": {"cosine": 0.9, "norm_ratio": 1.0},
                   "k2 in loss": good}}
    assert kl_estimators.verdict(values, wrong) == (True, False)
