"""Every pitfall notebook's verdict is a function of measured numbers: fed numbers where the bug is
absent it says "not reproduced", fed numbers where the fix failed it says "not fixed"."""

import math

import pytest
import torch

from workbench.experiments import comparison, statistics
from workbench.modeling.perturbation import perturbed_copy
from workbench.modeling.tiny import tiny_model
from workbench.pitfalls import nb01_position_ids as position_ids
from workbench.pitfalls import nb02_right_padding_flash_attention as padding
from workbench.pitfalls import nb03_eos_termination as eos
from workbench.pitfalls import nb04_dpo_loss_mask as dpo_mask
from workbench.pitfalls import nb05_grpo_loss_normalization as loss_normalization
from workbench.pitfalls import nb06_temperature as temperature
from workbench.pitfalls import nb07_dropout as dropout
from workbench.pitfalls import nb08_pad_equals_eos as pad_eos
from workbench.pitfalls import nb09_kl_estimators as kl_estimators
from workbench.pitfalls import nb10_grad_accumulation as grad_accumulation
from workbench.pitfalls import nb11_truncated_responses as truncation
from workbench.pitfalls import nb12_logprob_mismatch as rollout_mismatch
from workbench.pitfalls import nb13_whitening as whitening
from workbench.viz import plots


def test_position_ids_verdict_needs_a_drift():
    assert position_ids.verdict(0.4, 0.0) == (True, True)
    assert position_ids.verdict(3e-7, 3e-7) == (False, True)  # RoPE in fp32: positions differ, no drift
    assert position_ids.verdict(0.4, 0.3) == (True, False)


def test_position_ids_bf16_conclusion_is_chosen_by_the_numbers():
    sweep = {(a, "bf16", "left", m): [v] for a in ("llama", "qwen2") for m, v in (("model", 2e-3), ("mask", 2e-3))}
    assert "changes nothing measurable" in position_ids.bf16_rope_conclusion(sweep)[2]
    sweep = {(a, "bf16", "left", m): [v] for a in ("llama", "qwen2") for m, v in (("model", 2e-3), ("mask", 0.0))}
    assert "visible above" in position_ids.bf16_rope_conclusion(sweep)[2]


def test_padding_verdict_ignores_the_simulated_guard():
    packed = {"m": {"packed": 1e-6}}
    assert padding.verdict({"m": {"right_divergent_rows": 0, "left_divergent_rows": 0, "rows": 8}}, packed) == (False, True)
    assert padding.verdict({"m": {"right_divergent_rows": 3, "left_divergent_rows": 1, "rows": 8}}, packed) == (True, False)
    divergent = {"m": {"right_divergent_rows": 3, "left_divergent_rows": 0, "rows": 8}}
    assert padding.verdict(divergent, {"m": {"packed": 0.2}})[1] is False


def test_eos_verdict():
    def cost(steps, generated, needed, longest):
        return {"decode_steps": steps, "tokens_generated": generated, "tokens_needed": needed, "longest_response": longest}

    stops = {8: {"bug": cost(5, 40, 30, 5), "fix": cost(5, 40, 30, 5)}}  # a bug-free "bug" run
    assert eos.verdict(stops, 0.0) == (False, True)
    wasteful = {8: {"bug": cost(32, 256, 30, 5), "fix": cost(5, 40, 30, 5)}}
    assert eos.verdict(wasteful, 0.0) == (True, True)
    assert eos.verdict(wasteful, 1e-3) == (True, False)


def test_dpo_mask_verdict():
    clean = {"chosen_only": [], "both": []}
    assert dpo_mask.verdict(clean, 0.0, 0.0) == (False, True)
    buggy = {"chosen_only": [{"side": "rejected"}], "both": [{"side": "rejected"}]}
    assert dpo_mask.verdict(buggy, 0.3, 0.0) == (True, False)


def test_dpo_accuracy_conclusion():
    text = dpo_mask.accuracy_conclusion(0.40, {"both": 0.23, "chosen_only": 0.22, "none": 0.23}, 300)
    assert "every mode, the fix included, lowers it" in text and "not larger" in text
    assert "no mode changes it" in dpo_mask.accuracy_conclusion(0.40, {"both": 0.41, "chosen_only": 0.39}, 300)


def test_loss_normalisation_verdict_measures_the_trainers_kl_mix():
    probe = {"token-mean": {"loss": 0.11}, "seq-mean-token-mean": {"loss": 0.0}}
    effective = loss_normalization.effective_beta_sweep([1, 4], 0.04)
    assert effective["per_sequence"][1][0] == pytest.approx(0.04 * 5 / 2, rel=1e-5)  # β·mean(L)/L_short, L = 2 and 8
    assert loss_normalization.verdict(probe, effective, 0.04) == (True, True)
    uniform = {"per_sequence": [[0.04, 0.04]], "with_loss": [[0.04, 0.04]]}
    assert loss_normalization.verdict(probe, uniform, 0.04) == (False, True)
    mixed = {"per_sequence": [[0.1, 0.02]], "with_loss": [[0.1, 0.02]]}
    assert loss_normalization.verdict(probe, mixed, 0.04)[1] is False


def test_temperature_and_dropout_verdicts():
    ok = {"max_ratio_deviation": 1e-7, "sequence_kl_k1": 0.0}
    assert temperature.verdict({(0.7, False): ok, (0.7, True): ok, (1.0, False): ok, (1.0, True): ok}) == (False, True)
    assert temperature.verdict({(1.0, False): {"max_ratio_deviation": 0.5}, (1.0, True): ok}) == (False, True)  # τ = 1 is no bug
    assert dropout.verdict({(0.1, False): ok, (0.1, True): ok}) == (False, True)
    assert dropout.verdict({(0.1, False): {"max_ratio_deviation": 0.4}, (0.1, True): {"max_ratio_deviation": 0.4,
                                                                                     "sequence_kl_k1": 0.0}}) == (True, False)


def test_pad_eos_and_accumulation_and_whitening_verdicts():
    stops = {"finished_fraction": 1.0}
    assert pad_eos.verdict({True: stops, False: stops}) == (False, True)
    assert pad_eos.verdict({True: {"finished_fraction": 0.0}, False: {"finished_fraction": 0.5}}) == (True, False)
    assert "only 50% of greedy answers stop" in pad_eos.not_shown({True: {"finished_fraction": 0.0}, False: {"finished_fraction": 0.5}})
    assert pad_eos.not_shown({True: {"finished_fraction": 0.0}, False: stops}) is None
    assert grad_accumulation.verdict({"per_micro_batch": [0.0, 1e-7], "global": [0.0, 1e-7]}) == (False, True)
    centred = [{"naive_mean": 1e-8, "masked_mean": 0.0, "masked_std": 1.0}]
    assert whitening.verdict(centred) == (False, True)
    assert whitening.verdict([{"naive_mean": 0.3, "masked_mean": 0.1, "masked_std": 1.0}]) == (True, False)


def test_kl_verdict_is_about_gradients_not_identities():
    good = {"cosine": 1.0, "norm_ratio": 1.0}
    values = {0.1: {"k2": {"bias": 0.01}}}
    no_bug = {0.1: {"k1 in loss": {"cosine": 0.2, "norm_ratio": 0.3}, "k1 in reward": good, "k2 in loss": good}}
    assert kl_estimators.verdict(values, no_bug) == (False, True)
    wrong = {0.1: {"k1 in loss": {"cosine": 0.0, "norm_ratio": 1e-8}, "k1 in reward": {"cosine": 0.9, "norm_ratio": 1.0},
                   "k2 in loss": good}}
    assert kl_estimators.verdict(values, wrong) == (True, False)


def test_rollout_mismatch_verdict_needs_tis_to_act():
    fp32 = {"max_ratio_deviation": 0.0}
    assert rollout_mismatch.verdict({"bf16 rollout": {"max_ratio_deviation": 1e-5, "tis_clipped_fraction": 0.1},
                                     "fp32 rollout": fp32}) == (False, True)
    assert rollout_mismatch.verdict({"bf16 rollout": {"max_ratio_deviation": 0.2, "tis_clipped_fraction": 0.0},
                                     "fp32 rollout": fp32}) == (True, False)  # a cap above every ratio does nothing
    log_ratio = torch.log(torch.tensor([1.0, 1.1, 1.3, 0.9]))
    assert rollout_mismatch.clipped_fraction_by_cap(log_ratio, [1.05, 1.2, 2.0]) == [0.5, 0.25, 0.0]


def test_truncation_verdict_measures_the_push_towards_truncation():
    fixes = {"zero reward without EOS": {"pressure": -0.2}, "masked out of the loss": {"pressure": 0.0}}
    assert truncation.verdict({truncation.BUG: {"pressure": -0.2}, **fixes}) == (False, True)  # the bug changes nothing
    assert truncation.verdict({truncation.BUG: {"pressure": 0.4}, **fixes, "penalised": {"pressure": 0.1}}) == (True, False)
    assert "towards" in truncation.conclusion({truncation.BUG: {"pressure": -0.1, "mixed_groups": 3}, **fixes})


def test_truncation_pressure_on_a_model():
    from workbench.experiments.checkpoints import load
    from workbench.tasks import rl_problems

    model, tokenizer = load("tiny-arith-qwen2")
    measured = truncation.pressure(model, tokenizer, rl_problems(8), truncation.variants(0.5), max_new_tokens=3,
                                   num_generations=4)
    assert measured[truncation.BUG]["truncated_rewarded"] >= measured["zero reward without EOS"]["truncated_rewarded"] == 0
    assert measured[f"penalised ({0.5})"]["pressure"] <= measured["zero reward without EOS"]["pressure"] <= 0


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


def test_plots_smooth_is_aligned_and_colours_are_reserved():
    x, y = plots.smooth([0, 1, 2, 3, 4], 2)
    assert x == [1, 2, 3, 4] and y == [0.5, 1.5, 2.5, 3.5]
    x, y = plots.smooth([1.0, math.nan, 3.0], 1)
    assert x == [0, 1, 2] and y == [1.0, 2.0, 3.0]
    assert plots.BUG_COLOR not in plots.SERIES_COLORS[:2] and plots.FIX_COLOR not in plots.SERIES_COLORS[:2]


def test_perturbed_copy_is_seeded_and_leaves_the_original():
    model, _ = tiny_model("qwen2", seed=0)
    before = [p.clone() for p in model.parameters()]
    a, b = perturbed_copy(model, 0.01, seed=3), perturbed_copy(model, 0.01, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert any(not torch.equal(p, q) for p, q in zip(a.parameters(), model.parameters(), strict=True))


def test_plot_bands_draws_mean_and_band():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {"bug": [[{"step": i, "x": float(i + d)} for i in range(5)] for d in (0, 2)], "fix": [[{"step": i, "x": 0.0} for i in range(5)]]}
    fig, ax = plt.subplots()
    plots.plot_bands(ax, runs, "x", "x", window=2)
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["bug (n=2)", "fix (n=1)"]
    assert list(lines[0].get_ydata()) == [1.5, 2.5, 3.5, 4.5] and len(ax.collections) == 1  # one band: the 2-seed run
    plt.close(fig)


@pytest.mark.slow
def test_train_variants_in_processes_matches_serial():
    kwargs = dict(steps=1, seeds=(0, 1), problems=16, prompts_per_step=4, mini_batches=1, max_new_tokens=4)
    variants = {"a": {"whiten_over": "real"}}
    serial = comparison.train_variants("ppo", "tiny-arith-qwen2", variants, **kwargs)
    parallel = comparison.train_variants("ppo", "tiny-arith-qwen2", variants, processes=2, **kwargs)
    assert [[h["reward"] for h in run] for run in serial["a"]] == [[h["reward"] for h in run] for run in parallel["a"]]
