"""core.rollout_correction against values worked by hand, CleanRL style: every ratio here is a round number.

The batch used throughout: ρ = π_train / π_rollout = [[4, 0.5, 1], [2, ·, ·]] (row 1 has one token), so
log ρ = [[ln 4, −ln 2, 0], [ln 2]]. Parity with verl and TRL themselves is in tests/peers/test_rollout_correction_peers.py.
"""

import math

import pytest
import torch

from workbench.core import rollout_correction as rc
from workbench.core.errors import RolloutCorrectionError

pytestmark = pytest.mark.numeric  # held to AVX2 in .ci/run (docs/CPU_PORTABILITY.md)

LN2, LN4 = math.log(2), math.log(4)
RATIOS = [[4.0, 0.5, 1.0], [2.0, 1.0, 1.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def batch(ratios=RATIOS, mask=MASK, rollout=-1.0):
    """(old, rollout, mask) with old − rollout = log ρ."""
    rollout_lp = torch.full((len(ratios), len(ratios[0])), rollout)
    return torch.log(torch.tensor(ratios)) + rollout_lp, rollout_lp, mask.clone()


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float32), torch.as_tensor(expected, dtype=torch.float32),
                               atol=tol, rtol=0)


def metric(result, name):
    return result.metrics[rc.PREFIX + name]


# ---- importance weights -------------------------------------------------------------------------------------
def test_token_tis_truncates_each_ratio_at_the_bound():
    result = rc.correct(*batch(), rollout_is="token", rollout_is_threshold=2.0)
    close(result.weights, [[2.0, 0.5, 1.0], [2.0, 0.0, 0.0]])  # 4 → 2; padding 0
    torch.testing.assert_close(result.mask, MASK)  # no rejection asked
    close(metric(result, "rollout_is_mean"), (2 + 0.5 + 1 + 2) / 4)
    close(metric(result, "rollout_is_ratio_fraction_high"), 1 / 4)  # raw 4 > 2 (2 itself is not above)
    close(metric(result, "rollout_is_ratio_fraction_low"), 0.0)  # raw 0.5 is not below 1/2
    close(metric(result, "rollout_is_max"), 2.0)
    close(metric(result, "rollout_is_min"), 0.5)
    close(metric(result, "rollout_is_seq_mean"), (3.5 / 3 + 2) / 2)
    close(metric(result, "rollout_is_seq_max_deviation"), 1.0)  # |2 − 1|
    close(metric(result, "rollout_is_seq_fraction_high"), 0.0)  # raw row means 5.5/3 and 2: neither above 2
    std = math.sqrt((4 + 0.25 + 1 + 4) / 4 - 1.375 ** 2)
    close(metric(result, "rollout_is_std"), std, 1e-5)
    close(metric(result, "rollout_is_eff_sample_size"), 1 / ((4 + 0.25 + 1 + 4) / 4 / 1.375 ** 2), 1e-5)


def test_sequence_tis_uses_the_product_of_the_row():
    result = rc.correct(*batch(), rollout_is="sequence", rollout_is_threshold=1.5)
    close(result.weights, [[1.5, 1.5, 1.5], [1.5, 0.0, 0.0]])  # ∏ρ = 2 in both rows, truncated at 1.5
    close(metric(result, "rollout_is_max"), 2.0)  # of the raw row weights
    close(metric(result, "rollout_is_ratio_fraction_high"), 1.0)  # ln 2 > ln 1.5 in both rows


def test_icepop_zeroes_the_weights_outside_the_range():
    result = rc.correct(*batch(), rollout_is="token", rollout_is_threshold="0.5_3")
    close(result.weights, [[0.0, 0.5, 1.0], [2.0, 0.0, 0.0]])  # 4 is outside [0.5, 3]
    close(metric(result, "rollout_is_oob_ratio"), 1 / 4)
    close(metric(result, "rollout_is_min"), 0.0)


def test_batch_normalize_rescales_the_weights_to_mean_one():
    token = rc.correct(*batch(), rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=True)
    close(token.weights, torch.tensor([[2.0, 0.5, 1.0], [2.0, 0.0, 0.0]]) / 1.375)
    close(metric(token, "rollout_is_batch_norm_factor"), 1.375)
    close(metric(token, "rollout_is_mean"), 1.375)  # statistics are of the weights before normalising
    sequence = rc.correct(*batch(), rollout_is="sequence", rollout_is_threshold=4.0, rollout_is_batch_normalize=True)
    close(sequence.weights, MASK)  # both rows weigh 2: mean over rows 2
    close(metric(sequence, "rollout_is_batch_norm_factor"), 2.0)


def test_no_rollout_is_gives_no_weights_but_the_metrics():
    result = rc.correct(*batch())
    assert result.weights is None
    assert not any("rollout_is" in k or "rollout_rs" in k for k in result.metrics)
    assert rc.PREFIX + "chi2_token" in result.metrics


# ---- rejection --------------------------------------------------------------------------------------------
def test_token_k1_bounds_the_inverse_ratio():
    result = rc.correct(*batch(), rollout_rs="token_k1", rollout_rs_threshold=2.0)  # 1/ρ in [0.5, 2]
    torch.testing.assert_close(result.mask, torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]))  # ρ = 4: 1/ρ = 0.25
    close(metric(result, "rollout_rs_token_k1_masked_fraction"), 1 / 4)
    close(metric(result, "rollout_rs_token_k1_seq_masked_fraction"), 1 / 2)
    close(metric(result, "rollout_rs_masked_fraction"), 1 / 4)
    close(metric(result, "rollout_rs_token_k1_fraction_low"), 1 / 4)  # k1 = −ln 4 < ln 0.5
    close(metric(result, "rollout_rs_token_k1_mean"), (-LN4 + LN2 + 0 - LN2) / 4)
    asymmetric = rc.correct(*batch(), rollout_rs="token_k1", rollout_rs_threshold="0.2_1.0")  # 1/ρ ∈ [0.2, 1]: ρ ∈ [1, 5]
    torch.testing.assert_close(asymmetric.mask, torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]]))


def test_sequence_criteria_reject_whole_rows():
    k2_row0 = 0.5 * (LN4 ** 2 + LN2 ** 2)  # ≈ 1.201; row 1: ½ ln²2 ≈ 0.240
    result = rc.correct(*batch(), rollout_rs="seq_sum_k2", rollout_rs_threshold=1.0)
    torch.testing.assert_close(result.mask, torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    close(metric(result, "rollout_rs_seq_sum_k2_max"), k2_row0, 1e-5)
    close(metric(result, "rollout_rs_seq_sum_k2_mean"), (3 * k2_row0 + 0.5 * LN2 ** 2) / 4, 1e-5)  # token-weighted
    close(metric(result, "rollout_rs_seq_sum_k2_seq_mean"), (k2_row0 + 0.5 * LN2 ** 2) / 2, 1e-5)  # row-weighted
    k3_row0 = ((3 - LN4) + (-0.5 + LN2) + 0) / 3  # ≈ 0.602; row 1: 1 − ln 2 ≈ 0.307
    mean_k3 = rc.correct(*batch(), rollout_rs="seq_mean_k3", rollout_rs_threshold=0.5)
    torch.testing.assert_close(mean_k3.mask, torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    close(metric(mean_k3, "rollout_rs_seq_mean_k3_seq_max"), k3_row0, 1e-5)
    max_k2 = rc.correct(*batch(), rollout_rs="seq_max_k2", rollout_rs_threshold=0.5)  # row 0: ½ ln²4 ≈ 0.961
    torch.testing.assert_close(max_k2.mask, torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))


def test_chained_criteria_must_all_pass_and_take_one_bound_each():
    result = rc.correct(*batch(), rollout_rs="token_k1, seq_max_k2,token_k1", rollout_rs_threshold="2.0,1.0")
    torch.testing.assert_close(result.mask, torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]))  # seq_max_k2 0.961 ≤ 1
    close(metric(result, "rollout_rs_seq_max_k2_masked_fraction"), 0.0)
    shared = rc.correct(*batch(), rollout_rs="token_k2,token_k3", rollout_rs_threshold=0.5)  # one bound for both
    torch.testing.assert_close(shared.mask, torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]))  # k3(4) = 1.61


def test_the_mask_keeps_its_dtype():
    old, rollout, mask = batch()
    for dtype in (torch.bool, torch.long, torch.float32):
        result = rc.correct(old, rollout, mask.to(dtype), rollout_rs="token_k1", rollout_rs_threshold=2.0)
        assert result.mask.dtype == dtype
        assert result.mask.tolist() == torch.tensor([[0, 1, 1], [1, 0, 0]]).to(dtype).tolist()


# ---- empty rows, one token, non-finite values, bf16 ----------------------------------------------------------
def test_an_empty_row_gets_nothing_but_counts_in_row_means():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    result = rc.correct(*batch(RATIOS + [[8.0, 8.0, 8.0]], mask), rollout_is="token", rollout_is_threshold=2.0,
                        rollout_rs="token_k1", rollout_rs_threshold=2.0)
    close(result.weights[2], [0.0, 0.0, 0.0])
    close(result.mask[2], [0.0, 0.0, 0.0])
    close(metric(result, "rollout_is_seq_min"), 0.0)  # verl's convention: an empty row's mean weight is 0
    close(metric(result, "rollout_rs_token_k1_seq_masked_fraction"), 1 / 2)  # over the 2 rows with tokens
    close(metric(result, "rollout_rs_seq_masked_fraction"), 1 / 3)  # over all 3 rows (verl's convention)
    close(metric(result, "training_ppl"), (math.exp(1 - (LN4 - LN2) / 3) + math.exp(1 - LN2) + 1) / 3, 1e-5)


def test_a_single_token_has_zero_spread():
    one = torch.tensor([[1.0, 0.0, 0.0]])
    result = rc.correct(*batch([[4.0, 1.0, 1.0]], one), rollout_is="token", rollout_is_threshold=2.0)
    assert metric(result, "rollout_is_std") == 0.0
    assert metric(result, "rollout_is_seq_std") == 0.0
    close(metric(result, "rollout_is_eff_sample_size"), 1.0)


def test_infinite_log_probs_are_clamped_at_twenty():
    old, rollout, mask = batch()
    rollout[0, 0], old[0, 1] = float("-inf"), float("-inf")  # log ρ = +inf and −inf
    result = rc.correct(old, rollout, mask, rollout_is="token", rollout_is_threshold="0.5_2",
                        rollout_rs="token_k1", rollout_rs_threshold=2.0)
    close(result.weights[0], [0.0, 0.0, 1.0])  # e^20 and e^-20 both outside [0.5, 2]
    close(result.mask[0], [0.0, 0.0, 1.0])
    close(metric(result, "rollout_rs_token_k1_min"), -20.0)
    truncated = rc.correct(old, rollout, mask, rollout_is="token", rollout_is_threshold=2.0)
    close(truncated.weights[0, :2], [2.0, math.exp(-20)])


def test_nan_inside_the_response_is_refused_and_outside_ignored():
    old, rollout, mask = batch()
    rollout[1, 2] = float("nan")  # padding
    result = rc.correct(old, rollout, mask, rollout_is="sequence", rollout_is_threshold=2.0, rollout_rs="seq_mean_k1",
                        rollout_rs_threshold=2.0)
    assert result.weights[1, 2] == 0.0
    assert all(math.isfinite(v) for v in result.metrics.values())
    rollout[0, 1] = float("nan")
    with pytest.raises(RolloutCorrectionError, match=r"rollout_log_prob is NaN at response token \(0, 1\)") as error:
        rc.correct(old, rollout, mask, rollout_is="token")
    assert error.value.parameter == "rollout_log_prob"
    both = batch()
    both[0][0, 0] = both[1][0, 0] = float("-inf")  # −inf − (−inf)
    with pytest.raises(RolloutCorrectionError, match="old_log_prob - rollout_log_prob is NaN"):
        rc.correct(*both)


def test_bf16_inputs_are_upcast_before_any_arithmetic():
    old, rollout, mask = batch()
    old, rollout = old.bfloat16(), rollout.bfloat16()
    low = rc.correct(old, rollout, mask, rollout_is="sequence", rollout_is_threshold=3.0)
    full = rc.correct(old.float(), rollout.float(), mask, rollout_is="sequence", rollout_is_threshold=3.0)
    assert low.weights.dtype == torch.float32
    torch.testing.assert_close(low.weights, full.weights, atol=0, rtol=0)
    assert low.metrics == full.metrics


# ---- mismatch metrics -------------------------------------------------------------------------------------
def test_mismatch_metrics_by_hand():
    log_prob, rollout, mask = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -2.0]]), torch.ones(1, 2)  # log ρ = 0.5, 0
    m = {k.removeprefix(rc.PREFIX): v for k, v in rc.mismatch_metrics(log_prob, rollout, mask).items()}
    expected = {"kl": -0.25, "k3_kl": (math.exp(0.5) - 1.5) / 2, "training_ppl": math.exp(1.5), "training_log_ppl": 1.5,
                "rollout_ppl": math.exp(1.75), "rollout_log_ppl": 1.75, "log_ppl_diff": -0.25, "log_ppl_abs_diff": 0.25,
                "log_ppl_diff_max": -0.25, "log_ppl_diff_min": -0.25, "ppl_ratio": math.exp(-0.25),
                "chi2_token": (math.e + 1) / 2 - 1, "chi2_seq": math.e - 1}
    assert set(m) == set(expected)
    for name, value in expected.items():
        close(m[name], value, 1e-5)
    assert set(rc.correct(log_prob, rollout, mask).metrics) == {rc.PREFIX + k for k in expected}


# ---- TRL -----------------------------------------------------------------------------------------------
def test_trl_token_modes():
    truncate = rc.correct_trl(*batch(), rc.trl_mode("token_truncate", clip_min=0.6, clip_max=3.0))
    close(truncate.weights, [[3.0, 0.6, 1.0], [2.0, 0.0, 0.0]])
    torch.testing.assert_close(truncate.mask, MASK)
    masked = rc.correct_trl(*batch(), rc.trl_mode("token_mask", clip_min=0.6, clip_max=3.0))
    close(masked.weights, [[0.0, 0.0, 1.0], [2.0, 0.0, 0.0]])
    close(masked.metrics["sampling/importance_sampling_ratio/mean"], 3 / 4)  # over the response tokens
    close(masked.metrics["sampling/sampling_logp_difference/max"], LN4)


def test_trl_sequence_modes_do_not_clamp_before_exp():
    sequence = rc.correct_trl(*batch(), rc.trl_mode("sequence_mask", clip_max=1.5))
    close(sequence.weights, torch.zeros(2, 3))  # ∏ρ = 2 > 1.5 in both rows
    far = batch([[math.exp(-15), math.exp(-15), 1.0], [1.0, 1.0, 1.0]])
    weights = rc.correct_trl(*far, rc.trl_mode("sequence_truncate")).weights
    close(weights[0, 0] / math.exp(-30), 1.0, 1e-4)  # verl's clamp would give e^-20
    close(rc.correct_trl(*batch(), rc.trl_mode()).metrics["sampling/importance_sampling_ratio/min"], 2.0)


def test_trl_treats_a_nan_sampling_log_prob_as_ratio_one():
    old, rollout, mask = batch()
    rollout[0, 0] = float("nan")
    result = rc.correct_trl(old, rollout, mask, rc.trl_mode("token_truncate", clip_max=3.0))
    close(result.weights, [[1.0, 0.5, 1.0], [2.0, 0.0, 0.0]])
    close(result.metrics["sampling/sampling_logp_difference/max"], LN2)  # the NaN token is left out
    sequence = rc.correct_trl(old, rollout, mask, rc.trl_mode("sequence_truncate", clip_max=3.0))
    close(sequence.weights[0], [0.5, 0.5, 0.5])


def test_off_policy_mask_drops_negative_advantage_rows_that_drifted():
    log_prob, rollout = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]]), torch.tensor([[-0.5, -0.7], [-0.5, -0.7], [-0.9, -1.0]])
    mask = torch.ones(3, 2)
    keep = rc.off_policy_mask(torch.tensor([-1.0, 1.0, -1.0]), log_prob, rollout, mask, threshold=0.2)
    close(keep, [[0.0], [1.0], [1.0]])  # mean drifts 0.4, 0.4 (A ≥ 0: kept), 0.05
    rollout[0, 0] = float("nan")  # counted as 0: mean 0.15 ≤ 0.2
    close(rc.off_policy_mask(torch.tensor([-1.0, 1.0, -1.0]), log_prob, rollout, mask, 0.2)[0], [1.0])


# ---- presets and errors ----------------------------------------------------------------------------------
def test_presets_resolve_and_apply():
    assert rc.resolve(None) is None
    for name in rc.PRESETS:
        spec = rc.resolve(name)
        result = rc.apply(spec, *batch())
        assert result.mask.shape == MASK.shape
    assert rc.resolve({"rollout_is": "token"}) == {"rollout_is": "token"}
    assert rc.resolve("trl_sequence_mask") == rc.trl_mode()
    trl_config = {"vllm_importance_sampling_mode": "token_mask", "vllm_importance_sampling_clip_min": 0.5,
                  "off_policy_mask_threshold": 0.1}
    assert rc.resolve(trl_config) == rc.trl_mode("token_mask", clip_min=0.5, clip_max=3.0, off_policy_mask_threshold=0.1)


@pytest.mark.parametrize(("kwargs", "parameter", "words"), [
    ({"rollout_is": "tokens"}, "rollout_is", "'token' or 'sequence'"),
    ({"rollout_is": "token", "rollout_is_threshold": True}, "rollout_is_threshold", "a number"),
    ({"rollout_is": "token", "rollout_is_threshold": "abc"}, "rollout_is_threshold", "not a number"),
    ({"rollout_is": "token", "rollout_is_threshold": -1.0}, "rollout_is_threshold", "> 0"),
    ({"rollout_is": "token", "rollout_is_threshold": "3_2"}, "rollout_is_threshold", "above upper"),
    ({"rollout_is": "token", "rollout_is_threshold": None}, "rollout_is_threshold", "needs"),
    ({"rollout_is": "token", "rollout_is_batch_normalize": 1}, "rollout_is_batch_normalize", "True or False"),
    ({"rollout_rs": "token_k4", "rollout_rs_threshold": 1.0}, "rollout_rs", "unknown criterion"),
    ({"rollout_rs": "seq_max_k1", "rollout_rs_threshold": 1.0}, "rollout_rs", "unknown criterion"),
    ({"rollout_rs": " , "}, "rollout_rs", "names no criterion"),
    ({"rollout_rs": "token_k2"}, "rollout_rs_threshold", "required"),
    ({"rollout_rs": "token_k2,token_k3", "rollout_rs_threshold": "1,2,3"}, "rollout_rs_threshold", "3 bounds for 2"),
    ({"rollout_rs": "token_k2", "rollout_rs_threshold": "0.1_1"}, "rollout_rs_threshold", "not a range"),
    ({"rollout_rs": "token_k1", "rollout_rs_threshold": "2_1"}, "rollout_rs_threshold", "above upper"),
])
def test_bad_options_name_the_parameter(kwargs, parameter, words):
    with pytest.raises(RolloutCorrectionError, match=words) as error:
        rc.correct(*batch(), **kwargs)
    assert error.value.parameter == parameter


def test_bad_tensors_name_the_parameter():
    old, rollout, mask = batch()
    cases = [((old[:, :2], rollout, mask), "old_log_prob"), ((old, rollout[:1], mask), "rollout_log_prob"),
             ((old, rollout, mask[None]), "response_mask"),
             ((old.long(), rollout, mask), "old_log_prob"), ((old, rollout, mask * 2), "response_mask"),
             ((old, rollout, torch.zeros_like(mask)), "response_mask")]
    for args, parameter in cases:
        with pytest.raises(RolloutCorrectionError) as error:
            rc.correct(*args)
        assert error.value.parameter == parameter


def test_bad_trl_settings_and_specs():
    with pytest.raises(RolloutCorrectionError, match="mode must be one of"):
        rc.trl_mode("token")
    with pytest.raises(RolloutCorrectionError, match="needs clip_min or clip_max"):
        rc.trl_mode("token_truncate", clip_max=None)
    with pytest.raises(RolloutCorrectionError, match="above clip_max"):
        rc.trl_mode("token_mask", clip_min=3.0, clip_max=2.0)
    with pytest.raises(RolloutCorrectionError, match="unknown preset"):
        rc.resolve("tis")
    with pytest.raises(RolloutCorrectionError, match="unknown keyword"):
        rc.resolve({"rollout_is": "token", "threshold": 2.0})
    with pytest.raises(RolloutCorrectionError, match="rollout_is_threshold"):
        rc.resolve({"rollout_is": "token", "rollout_is_threshold": "x"})
