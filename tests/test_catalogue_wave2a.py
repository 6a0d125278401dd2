"""P14, P15, P16, P18, P20: each pitfall's signature with the bug, its absence with the fix, the maths
against hand-computed values, and verdict functions that say False on bug-absent numbers."""

import math

import pytest
import torch

from workbench.experiments.checkpoints import load
from workbench.modeling.rollout import sample
from workbench.tasks import encode_prompts, rl_problems

PROMPTS = [p.prompt for p in rl_problems(32)]


@pytest.fixture(scope="module")
def qwen():
    return load("tiny-arith-qwen2")


# ---- P14 truncated sampling, full-vocabulary scoring -------------------------------------------
def test_p14_filters_on_a_four_token_distribution():
    from workbench.core.sampling_filters import kept_mass, kept_set, processed_logprobs

    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert kept_set(logits, top_p=0.7).tolist() == [True, True, False, False]  # mass before token 2 is 0.8 ≥ 0.7
    assert kept_set(logits, top_k=3).tolist() == [True, True, True, False]
    # top-k first, then top-p on the renormalised top-3: [0.526, 0.316, 0.158] → mass before token 2 is 0.842 ≥ 0.7
    assert kept_set(logits, top_k=3, top_p=0.7).tolist() == [True, True, False, False]
    assert kept_set(logits, top_p=0.01).tolist() == [True, False, False, False]  # the top token is always kept
    assert float(kept_mass(logits, top_p=0.7)) == pytest.approx(0.8, abs=1e-6)
    assert float(kept_mass(logits, top_k=3)) == pytest.approx(0.95, abs=1e-6)
    logp = processed_logprobs(logits.expand(4, 4), torch.arange(4), top_p=0.7)
    assert logp[:2].tolist() == pytest.approx([math.log(0.5 / 0.8), math.log(0.3 / 0.8)], abs=1e-6)
    assert torch.isinf(logp[2:]).all()
    assert processed_logprobs(logits, torch.tensor(0)).item() == pytest.approx(math.log(0.5), abs=1e-6)  # filters off


def test_p14_bad_filters_are_clear_errors(qwen):
    from workbench.core.sampling_filters import kept_set

    with pytest.raises(ValueError, match="top_p must be in"):
        kept_set(torch.zeros(4), top_p=0.0)
    with pytest.raises(ValueError, match="top_k must be an integer"):
        kept_set(torch.zeros(4), top_k=-1)
    model, tokenizer = qwen
    ids, mask = encode_prompts(tokenizer, PROMPTS[:2])
    with pytest.raises(ValueError, match="engine='workbench'"):
        sample(model, ids, mask, max_new_tokens=2, eos_token_id=2, pad_token_id=0, top_p=0.8, engine="hf")


def test_p14_sampler_draws_only_kept_tokens_and_records_processed_logprobs(qwen):
    from workbench.core.sampling_filters import kept_set, processed_logprobs
    from workbench.pitfalls.nb14_truncated_sampling import response_logits, rollout_with_filters

    model, tokenizer = qwen
    rollout = rollout_with_filters(model, tokenizer, PROMPTS, top_k=2, top_p=0.9, temperature=1.3)
    logits, real = response_logits(model, rollout, 1.3), rollout.response_mask.bool()
    kept = kept_set(logits, top_k=2, top_p=0.9).gather(-1, rollout.response_ids[..., None]).squeeze(-1)
    assert kept[real].all()
    torch.testing.assert_close(processed_logprobs(logits, rollout.response_ids, top_k=2, top_p=0.9)[real],
                               rollout.rollout_logprobs[real], atol=1e-5, rtol=0)
    ids, mask = encode_prompts(tokenizer, PROMPTS[:8])
    greedy = sample(model, ids, mask, max_new_tokens=4, eos_token_id=2, pad_token_id=0, greedy=True)
    top1 = sample(model, ids, mask, max_new_tokens=4, eos_token_id=2, pad_token_id=0, top_k=1,
                  generator=torch.Generator().manual_seed(3))
    assert torch.equal(greedy.response_ids, top1.response_ids)


def test_p14_ratio_is_the_kept_mass_and_the_fix_gives_one(qwen):
    from workbench.pitfalls import nb14_truncated_sampling as ts

    model, tokenizer = qwen
    row = ts.first_step_ratio(model, tokenizer, PROMPTS, top_p=0.8)
    assert row["bug"]["mean_ratio"] < 0.99 and row["bug"]["mean_ratio"] == pytest.approx(row["kept_mass"], abs=1e-5)
    assert row["max_ratio_minus_mass"] < 1e-5 and row["bug"]["max_ratio_deviation"] <= 0.2 + 1e-5  # S ≥ top_p
    assert row["fix"]["max_ratio_deviation"] < 1e-4
    assert ts.verdict(row) == (True, True)
    top_k = ts.first_step_ratio(model, tokenizer, PROMPTS, top_k=1)
    assert top_k["bug"]["clip_fraction"] > 0.1 and top_k["fix"]["clip_fraction"] == 0.0
    off = ts.first_step_ratio(model, tokenizer, PROMPTS)  # no filters: no bug to reproduce
    assert ts.verdict(off)[0] is False and off["bug"]["max_ratio_deviation"] < 1e-4


def test_p14_verdict_says_false_on_bug_absent_numbers():
    from workbench.pitfalls.nb14_truncated_sampling import verdict

    clean = {"kept_mass": 0.9, "bug": {"mean_ratio": 1.0}, "fix": {"max_ratio_deviation": 0.0}}
    assert verdict(clean) == (False, True)
    broken_fix = {"kept_mass": 0.9, "bug": {"mean_ratio": 0.9}, "fix": {"max_ratio_deviation": 0.05}}
    assert verdict(broken_fix) == (True, False)


# ---- P15 entropy and KL at the wrong temperature -----------------------------------------------
def test_p15_entropy_and_kl_at_temperature_by_hand():
    from workbench.pitfalls.nb15_temperature_entropy import entropy_at_temperature, kl_between_temperatures

    logits = torch.tensor([0.0, math.log(3.0)])  # τ = 1: [1/4, 3/4]; τ = 0.5: [1/10, 9/10]
    h1 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    h05 = -(0.1 * math.log(0.1) + 0.9 * math.log(0.9))
    assert float(entropy_at_temperature(logits, 1.0)) == pytest.approx(h1, abs=1e-6)
    assert float(entropy_at_temperature(logits, 0.5)) == pytest.approx(h05, abs=1e-6)
    kl = 0.1 * math.log(0.1 / 0.25) + 0.9 * math.log(0.9 / 0.75)
    assert float(kl_between_temperatures(logits, 0.5, 1.0)) == pytest.approx(kl, abs=1e-6)
    assert float(kl_between_temperatures(logits, 0.5, 0.5)) == pytest.approx(0.0, abs=1e-7)


def test_p15_entropy_gap_and_step0_kl_vanish_with_the_fix(qwen):
    from workbench.pitfalls import nb15_temperature_entropy as te

    model, tokenizer = qwen
    rows = te.sweep(model, tokenizer, PROMPTS, [0.7, 1.0])
    cold, one = rows
    assert cold["entropy_gap"] > 0.01 and cold["bug"]["kl_exact"] > 1e-3 and cold["bug"]["kl_k3"] > 1e-3
    assert cold["fix"]["kl_exact"] == pytest.approx(0, abs=1e-6) and cold["fix"]["kl_k1"] == pytest.approx(0, abs=1e-6)
    assert abs(one["entropy_gap"]) < 1e-6 and abs(one["bug"]["kl_exact"]) < 1e-6  # τ = 1: nothing to see
    assert te.verdict(rows) == (True, True)
    assert te.verdict([one])[0] is False


def test_p15_verdict_says_false_on_bug_absent_numbers():
    from workbench.pitfalls.nb15_temperature_entropy import verdict

    clean = {"temperature": 0.7, "entropy_gap": 0.0, "bug": {"kl_exact": 0.0}, "fix": {"kl_exact": 0.0, "kl_k1": 0.0}}
    assert verdict([clean]) == (False, True)
    residue = {"temperature": 0.7, "entropy_gap": 0.1, "bug": {"kl_exact": 0.02}, "fix": {"kl_exact": 0.01, "kl_k1": 0.0}}
    assert verdict([residue]) == (True, False)


# ---- P16 group statistics -----------------------------------------------------------------------
def test_p16_one_pass_vs_two_pass_std_by_hand():
    from workbench.pitfalls.nb16_group_statistics import one_pass_std, two_pass_std

    constant = torch.full((7,), 0.95)
    # the fp32 rounding residue of E[x²] − E[x]²: a few ulps of 0.95² (2⁻²³ relative), so std ≤ √(8 · 2⁻²³ · 0.95² · 7/6) ≈ 1e-3;
    # its exact value (4.567e-4 here and in NeMo-RL #4158) depends on the order the sums run in, so only the bound is asserted
    residue = float(one_pass_std(constant))
    assert 0 < residue < math.sqrt(8 * 2**-23 * 0.95**2 * 7 / 6)
    assert float(two_pass_std(constant)) < 1e-7
    assert float(one_pass_std(torch.full((7,), 0.5))) == 0.0  # dyadic rewards cancel exactly
    pair = torch.tensor([1.0, 1.0078125])  # 1 and 1 + 2⁻⁷, both exact in bf16
    assert float(two_pass_std(pair)) == pytest.approx(2**-7 / math.sqrt(2), rel=1e-6)
    # bf16 one pass: E[x²] = (1 + 1.015625)/2 = 1.0078125 (x² rounded), E[x] = 1.00390625 rounds (to even) to 1,
    # so var = 0.0078125 · 2/1 and std = 0.125: 16× the true 0.0055
    assert float(one_pass_std(pair, torch.bfloat16)) == 0.125


def test_p16_leave_one_out_singleton_explodes_without_the_floor():
    from workbench.pitfalls.nb16_group_statistics import loo_advantages

    rewards = torch.tensor([0.0] + [0.95] * 7)
    # NeMo-RL #4158 measured −2075.39: −0.95 over the residue std of the seven 0.95s, which is below ~1e-3 (test above)
    assert float(loo_advantages(rewards, std="one-pass")[0]) < -0.95 / 1e-3
    assert float(loo_advantages(rewards, std="two-pass")[0]) < -1e5  # a smaller residue is worse
    assert float(loo_advantages(rewards, std="two-pass", floor=1e-3)[0]) == pytest.approx(-0.95, abs=1e-6)
    assert float(loo_advantages(torch.tensor([0.0] + [0.5] * 7), std="one-pass")[0]) == -0.5  # dyadic: no residue


def test_p16_stride_vs_group_ids_by_hand():
    from workbench.core import losses
    from workbench.pitfalls.nb16_group_statistics import grouped_advantages, misgrouping, stride_advantages

    # groups of 2: [1, 0], [1] (one rollout failed), [0, 1]
    rewards, ids = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 2, 2])
    s = 1 / math.sqrt(2)
    assert stride_advantages(rewards, 2).tolist() == pytest.approx([s, -s, s, -s, 1e6], rel=1e-5)
    assert grouped_advantages(rewards, ids).tolist() == pytest.approx([s, -s, 0.0, -s, s], rel=1e-5)
    stats = misgrouping(rewards, ids, 2)
    assert stats["misgrouped_fraction"] == pytest.approx(3 / 5) and stats["max_abs_advantage_bug"] == pytest.approx(1e6)
    # full groups, any order: the same numbers as the workbench's own group_advantages
    full = torch.tensor([1.0, 0.0, 0.0, 0.3, 0.3, 0.3, 1.0, 0.0, 1.0])
    expected = losses.group_advantages(full, 3, eps=1e-4)
    torch.testing.assert_close(grouped_advantages(full, torch.arange(3).repeat_interleave(3), eps=1e-4, floor=0.0), expected)
    order = torch.randperm(9, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(grouped_advantages(full[order], torch.arange(3).repeat_interleave(3)[order], eps=1e-4, floor=0.0),
                               expected[order])


def test_p16_partial_groups_on_the_tiny_model(qwen):
    from workbench.pitfalls import nb16_group_statistics as gs

    model, tokenizer = qwen
    rewards = gs.sample_group_rewards(model, tokenizer, rl_problems(16), 8)
    assert 0 < float(rewards.mean()) < 1
    full = gs.misgrouping(rewards.flatten(), torch.arange(16).repeat_interleave(8), 8)
    assert full["misgrouped_fraction"] == 0.0 and full["mean_abs_difference"] < 1e-5  # full groups: stride is fine
    row = gs.partial_group_sweep(rewards, [0.1], 8)[0]
    assert row["misgrouped_fraction"] > 0.3 and row["max_abs_group_mean_fix"] < 1e-6
    assert gs.verdict(gs.singleton_sweep([0.95])[0], row) == (True, True)


def test_p16_verdict_says_false_on_bug_absent_numbers():
    from workbench.pitfalls.nb16_group_statistics import verdict

    singleton = {"value": 0.5, "one-pass": -0.5, "two-pass + floor": -0.5}
    assert verdict(singleton, {"misgrouped_fraction": 0.0, "max_abs_group_mean_fix": 0.0}) == (False, True)
    assert verdict({**singleton, "one-pass": -2075.0, "two-pass + floor": -2075.0},
                   {"misgrouped_fraction": 0.5, "max_abs_group_mean_fix": 0.0}) == (True, False)


# ---- P18 padding pollutes metrics ---------------------------------------------------------------
def test_p18_logged_metrics_by_hand():
    from workbench.pitfalls.nb18_padding_metrics import logged_metrics

    logp = torch.tensor([[-1.0, -2.0, -30.0], [-0.5, -30.0, -30.0]])  # −30: the log-prob of a pad token
    ref = torch.tensor([[-1.5, -2.0, -29.0], [-0.5, -28.0, -28.0]])
    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])  # stored as 0 where masked
    entropy = torch.tensor([[0.4, 0.2, 3.0], [0.6, 3.0, 3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    m = logged_metrics(logp, ref, old, entropy, mask)
    assert m["masked"]["entropy"] == pytest.approx(0.4) and m["masked"]["kl"] == pytest.approx(0.5 / 3)
    assert m["masked"]["ratio"] == pytest.approx(1.0) and m["masked"]["sequence_entropy"] == pytest.approx(1.75)
    assert m["sentinel"]["sequence_entropy"] == pytest.approx(0.25)  # rows: 1 + 2 − 1 and 0.5 − 1 − 1
    assert m["unmasked"]["entropy"] == pytest.approx(10.2 / 6) and m["unmasked"]["kl"] == pytest.approx((0.5 - 1 - 2 - 2) / 6)


def test_p18_unmasked_and_sentinel_statistics_move_with_the_pad_count(qwen):
    from workbench.pitfalls import nb18_padding_metrics as pm

    policy, tokenizer = qwen
    reference, _ = load("tiny-arith-gpt2")
    rows = pm.pad_invariance(policy, reference, tokenizer, PROMPTS[:16], [0, 8])
    assert rows[0]["sentinel"]["sequence_entropy"] - rows[1]["sentinel"]["sequence_entropy"] == pytest.approx(8.0, abs=1e-4)
    assert pm.drift(rows, "unmasked", "ratio") > 0.1 and pm.drift(rows, "unmasked", "kl") > 0.1
    assert all(pm.drift(rows, "masked", k) < 1e-5 for k in ("entropy", "kl", "ratio", "sequence_entropy"))
    assert pm.verdict(rows) == (True, True)


def test_p18_verdict_says_false_on_bug_absent_numbers():
    from workbench.pitfalls.nb18_padding_metrics import verdict

    values = {"entropy": 0.6, "kl": 0.5, "ratio": 1.0, "sequence_entropy": 2.0}
    same = [{"extra_pads": w, **{mode: dict(values) for mode in ("unmasked", "sentinel", "masked")}} for w in (0, 8)]
    assert verdict(same) == (False, True)
    moved = [same[0], {**same[1], "masked": {**values, "kl": 0.6}}]
    assert verdict(moved) == (False, False)


# ---- P20 the gradient of a KL estimate ----------------------------------------------------------
def test_p20_exact_kl_gradient_of_a_three_token_softmax_by_hand():
    from workbench.pitfalls import nb20_kl_gradient as kg

    theta = torch.zeros(3, dtype=torch.float64)  # π = [1/3, 1/3, 1/3]
    ref = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64).log()  # π_ref = [1/6, 2/6, 3/6]
    r = torch.tensor([math.log(2), 0.0, math.log(2 / 3)], dtype=torch.float64)
    kl = float(r.mean())
    assert float(kg.exact_kl(theta, ref)) == pytest.approx(kl, abs=1e-12)
    expected = ((r - kl) / 3).tolist()  # π_j (r_j − KL) = [0.19908, −0.03196, −0.16712]
    assert kg.exact_kl_gradient(theta, ref).tolist() == pytest.approx(expected, abs=1e-12)
    leaf = theta.clone().requires_grad_(True)
    assert torch.autograd.grad(kg.exact_kl(leaf, ref), leaf)[0].tolist() == pytest.approx(expected, abs=1e-12)
    assert kg.expected_gradient(theta, ref, "k1 in loss").abs().max() < 1e-15  # no gradient at all
    for variant in ("k2 in loss", "k1 in reward", "w·k1 in reward", "w·k3 in loss"):
        assert kg.expected_gradient(theta, ref, variant).tolist() == pytest.approx(expected, abs=1e-12), variant
    # k3 in the loss: the gradient of the forward KL(π_ref ‖ π), which is π − π_ref on the logits
    assert kg.expected_gradient(theta, ref, "k3 in loss").tolist() == pytest.approx([1 / 6, 0.0, -1 / 6], abs=1e-12)
    with pytest.raises(ValueError, match="unknown variant"):
        kg.expected_gradient(theta, ref, "k4 in loss")


def test_p20_off_policy_needs_the_importance_weight():
    from workbench.pitfalls import nb20_kl_gradient as kg

    theta, ref = kg.small_softmax(8, seed=1)
    old = theta + 0.3 * torch.randn(8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    rows = kg.compare(theta, ref, sampling_logits=old)
    assert rows["k2 in loss"]["relative_error"] > 0.01 and rows["k1 in reward"]["relative_error"] > 0.01
    assert rows["w·k1 in reward"]["relative_error"] < 1e-10 and rows["w·k3 in loss"]["relative_error"] < 1e-10


def test_p20_monte_carlo_bias_floor_vs_unbiased_decay():
    from workbench.pitfalls import nb20_kl_gradient as kg

    theta, ref = kg.small_softmax(6)
    k1_reward = kg.monte_carlo_error(theta, ref, "k1 in reward", [4, 4096], trials=10)
    k3_loss = kg.monte_carlo_error(theta, ref, "k3 in loss", [4, 4096], trials=10)
    assert k1_reward[1] < 0.1 < k1_reward[0] and k3_loss[1] > 0.3  # 1/√N decay vs the forward-KL floor


def test_p20_tiny_model_next_token_distributions(qwen):
    from workbench.pitfalls import nb20_kl_gradient as kg

    policy, tokenizer = qwen
    reference, _ = load("tiny-arith-gpt2")
    theta = kg.next_token_logits(policy, tokenizer, PROMPTS[:8])
    ref = kg.next_token_logits(reference, tokenizer, PROMPTS[:8])
    on = kg.compare(theta, ref)
    off = kg.off_policy_sweep(theta, ref, [0.2])[0]
    assert on["k1 in loss"]["norm_ratio"] < 1e-10 and on["k3 in loss"]["relative_error"] > 0.1
    assert off["k2 in loss"]["relative_error"] > 0.01
    assert kg.verdict(on, off) == (True, True)


def test_p20_verdict_says_false_on_bug_absent_numbers():
    from workbench.pitfalls.nb20_kl_gradient import VARIANTS, verdict

    exact = {v: {"relative_error": 0.0, "norm_ratio": 1.0, "cosine": 1.0} for v in VARIANTS}
    assert verdict(exact, exact) == (False, True)
    biased_off = {**exact, "w·k3 in loss": {"relative_error": 0.2, "norm_ratio": 1.0, "cosine": 0.9}}
    assert verdict(exact, biased_off)[1] is False
