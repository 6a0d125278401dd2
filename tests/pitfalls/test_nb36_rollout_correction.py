"""nb36_rollout_correction: the pure maths against hand-computed values and autograd, the paired estimator trials on the
tiny model (a large stale gap biases the uncorrected gradient; a truncated ratio removes it), the verdict both ways,
the printers, metrics(), the figures and the explorer."""


import pytest
import torch
from pitfall_fakes import check_metrics, drew, fake_runs

from workbench.experiments.gradient_estimators import bias_variance
from workbench.modeling.scoring import response_logprobs
from workbench.pitfalls import nb36_rollout_correction as rcn
from workbench.tasks import encode_prompts, rl_problems

pytestmark = pytest.mark.numeric


# ---- pure functions against hand-computed values -------------------------------------------------
def test_leave_one_out_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])  # two groups of 3
    expected = [1 - 0.0, 0 - 0.5, 0 - 0.5, 0.0, 0.0, 0.0]
    assert rcn.leave_one_out_advantages(rewards, 3).tolist() == pytest.approx(expected)


def test_weight_summary_by_hand():
    weights, mask = torch.tensor([[1.0, 0.0, 2.0, 5.0]]), torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    summary = rcn.weight_summary(weights, mask)  # the response tokens' weights: 1, 0, 2
    assert summary["masked_share"] == pytest.approx(1 / 3)
    assert summary["ess_share"] == pytest.approx(9 / (3 * 5))  # (Σw)² / (n Σw²)
    assert summary["mean_weight"] == pytest.approx(1.0)


def test_head_features_and_gradients_equal_autograd(qwen):
    model, tokenizer = qwen
    prompts = [p.prompt for p in rl_problems(3)]
    ids, mask = encode_prompts(tokenizer, prompts)
    responses = torch.tensor([[5, 6, 7], [8, 9, 0], [10, 11, 12]])
    response_mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    features = rcn.head_features(model, ids, mask, responses, response_mask, temperature=0.8)
    logp = response_logprobs(model, ids, mask, responses, response_mask, temperature=0.8)
    assert torch.allclose(features["logp"] * response_mask, logp * response_mask, atol=1e-5)
    coefficients = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.3, 0.0], [-0.7, 0.2, 1.0]])
    model.zero_grad(set_to_none=True)
    # autograd through the output layer only: hidden states detached (the closed form holds them fixed)
    head = model.get_output_embeddings()
    hidden = features["hidden"].detach()
    scores = (hidden @ head.weight.T / 0.8).log_softmax(-1).gather(-1, responses[..., None]).squeeze(-1)
    ((coefficients * response_mask * scores).sum() / 3).backward()
    closed = rcn.head_gradients(coefficients * response_mask, features["dlogits"], features["hidden"], batches=1)
    assert torch.allclose(closed.reshape(head.weight.shape), head.weight.grad, atol=1e-5)
    model.zero_grad(set_to_none=True)


def test_head_features_share_a_repeated_prompt_and_equal_a_full_forward(qwen):
    """Rows repeating a prompt run it once (KV cache copied): their log-probs and the reported τ=1 log-probs equal
    ``response_logprobs``' full forward, rows of different prompt lengths and an early EOS included."""
    model, tokenizer = qwen
    problems = rl_problems(2)
    ids, mask = encode_prompts(tokenizer, [problems[0].prompt, problems[1].prompt, problems[0].prompt, problems[1].prompt])
    responses = torch.tensor([[5, 6, 7, 8], [8, 9, 0, 0], [10, 11, 12, 13], [4, 3, 2, 1]])
    response_mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    features = rcn.head_features(model, ids, mask, responses, response_mask, temperature=0.8, report_temperature=1.0)
    for temperature, key in ((0.8, "logp"), (1.0, "reported")):
        logp = response_logprobs(model, ids, mask, responses, response_mask, temperature=temperature)
        assert torch.allclose(features[key] * response_mask, logp * response_mask, atol=1e-5)
    single = rcn.head_features(model, ids[:1], mask[:1], responses[:1], response_mask[:1], temperature=0.8)
    assert torch.allclose(single["hidden"][0], features["hidden"][0], atol=1e-5)


def test_estimator_weights_none_is_the_mask_and_tis_truncates():
    trainer = torch.log(torch.tensor([[0.9, 0.5, 0.2]]))
    rollout = torch.log(torch.tensor([[0.3, 0.5, 0.4]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert rcn.estimator_weights(None, trainer, rollout, mask).tolist() == [[1.0, 1.0, 0.0]]
    weights = rcn.estimator_weights("decoupled_token_is", trainer, rollout, mask)
    assert weights[0].tolist() == pytest.approx([2.0, 1.0, 0.0])  # ratio 3 truncated at 2; ratio 1; outside the response


# ---- the trials on the tiny model -----------------------------------------------------------------
@pytest.fixture(scope="module")
def trials(qwen):
    model, tokenizer = qwen
    actors = rcn.stale_actors(model, tokenizer, [1, 4], learning_rate=1e-3, prompts_per_step=8, num_generations=4)
    sources = rcn.gap_sources(model, actors, 0.5)
    estimators = {k: rcn.ESTIMATORS[k] for k in ("none", "verl token TIS (default)", "TRL sequence_mask (default)", "verl geo RS")}
    return rcn.estimator_trials(sources, tokenizer, rl_problems(8), trials=10, group_size=4, estimators=estimators)


def test_a_stale_sampler_biases_the_uncorrected_gradient_and_a_truncated_ratio_removes_it(trials):
    stale = rcn.stale_name(4)
    entry = trials["sources"][stale]
    assert entry["diagnostics"]["k3_kl"] > 0 and entry["diagnostics"]["k1_row_mean"] > 0  # another policy sampled
    assert rcn.biased(entry["estimators"]["none"])  # the signature: no correction, bias beyond 3 s.e.
    best = rcn.best_estimator(trials, stale)
    assert best != "verl geo RS" and not rcn.biased(entry["estimators"][best])
    assert rcn.verdict(trials, stale, best) == (True, True) and rcn.not_shown(trials, stale) is None
    assert entry["estimators"]["verl geo RS"]["masked_share"] > 0.5  # a 0.999–1.001 band rejects most sequences
    no_gap = trials["sources"][rcn.NO_GAP]
    assert no_gap["diagnostics"]["mean_abs_gap"] < 1e-5
    assert all(not rcn.biased(s) for s in no_gap["estimators"].values())  # no gap: nothing is biased (switch off)
    before = trials["sources"][rcn.BEFORE_TEMPERATURE]
    assert before["diagnostics"]["k1_row_mean"] < -3 * before["diagnostics"]["k1_row_se"]  # π sampled, the report is wrong
    assert before["estimators"]["none"]["bias2"] == pytest.approx(0, abs=1e-6)  # the samples are on-policy
    assert rcn.largest_trainable_gap(trials) == stale


def verdict_trials(none_z: float, best_z: float) -> dict:
    def stats(z):
        return {"z": z, "bias2": 0.01 * z, "bias2_se": 0.01, "bias2_null_se": 0.01, "variance": 0.5, "variance_se": 0.01,
                "mse": 0.5 + 0.01 * z, "relative_bias": 0.1, "batches": 8, "masked_share": 0.0, "ess_share": 1.0, "mean_weight": 1.0}
    estimators = {"none": stats(none_z), "verl token TIS (default)": stats(best_z), "TRL sequence_mask (default)": stats(best_z + 0.5)}
    diagnostics = {"k3_kl": 0.004, "k1_row_mean": 0.004, "k1_row_se": 0.001, "mean_abs_gap": 0.04, "chi2_token": 0.01,
                   "chi2_seq": 0.03, "log_ppl_abs_diff": 0.03}
    return {"sources": {rcn.stale_name(4): {"diagnostics": diagnostics, "estimators": estimators}}, "trials": 8, "group_size": 4,
            "prompts": 8}


def test_verdict_both_ways_with_numbers():
    stale = rcn.stale_name(4)
    shown = verdict_trials(none_z=5.0, best_z=1.0)
    assert rcn.best_estimator(shown, stale) == "verl token TIS (default)"
    assert rcn.verdict(shown, stale, "verl token TIS (default)") == (True, True)
    hidden = verdict_trials(none_z=2.0, best_z=1.0)  # the bias is within its noise: not reproduced, and said why
    assert rcn.verdict(hidden, stale, "verl token TIS (default)") == (False, True)
    assert "2.0 standard errors only" in rcn.not_shown(hidden, stale)
    every_biased = verdict_trials(none_z=5.0, best_z=4.0)  # no correction within noise: the smallest error wins, not fixed
    best = rcn.best_estimator(every_biased, stale)
    assert best == "verl token TIS (default)" and rcn.verdict(every_biased, stale, best) == (True, False)


def test_training_variants_effects_and_metrics(trials, tmp_path):
    lag, best = 4, "verl seq IS + RS"
    variants = rcn.training_variants(lag, best)
    assert list(variants) == [rcn.NO_GAP_RUN, rcn.bug_run(lag), *(rcn.corrected_run(n) for n in (*rcn.DEFAULTS, best))]
    assert variants[rcn.corrected_run(best)] == {"rollout_staleness": 4, "rollout_correction": "decoupled_seq_is_rs"}
    assert len(rcn.training_variants(lag, rcn.DEFAULTS[0])) == 4  # a default ranked best runs once
    runs = fake_runs(list(variants), ["reward"], seeds=3)
    effects, corrections = rcn.training_effects(runs, lag), rcn.correction_effects(runs, lag)
    assert set(effects) == {"reward", "heldout_accuracy"} and len(corrections) == 3
    text = rcn.training_lines(effects, corrections, runs, "arith")
    assert text.startswith("Prediction, fixed before the run (arith)") and "each corrected stale run against no gap" in text
    stale = rcn.stale_name(4)
    trained_best = rcn.best_estimator(trials, stale)
    kwargs = rcn.metrics(trials=trials, trained=stale, best=trained_best, runs=runs, effects=effects, corrections=corrections,
                         settings={"steps": 4}, task="arith")
    check_metrics(kwargs, "36_rollout_correction")
    assert kwargs["metrics"]["prediction"]["direction"] == "-" and kwargs["metrics"]["prediction"]["measure"] == "reward"
    assert kwargs["headline"]["bug"] == trials["sources"][stale]["estimators"]["none"]["bias2"]
    assert kwargs["reproduced"] and kwargs["fixed"] and kwargs["not_shown"] is None
    assert "pool" not in kwargs["metrics"]["diagnostics"][stale]  # tensors stay out of metrics.json
    assert drew(rcn.figure_training(runs, 4))


def test_printers_figures_and_explorer(trials):
    stale = rcn.stale_name(4)
    best = rcn.best_estimator(trials, stale)
    assert len(rcn.diagnostics_lines(trials).splitlines()) == len(trials["sources"])
    sentence = rcn.diagnostics_sentence(trials, stale)
    assert rcn.BEFORE_TEMPERATURE in sentence.split(";")[0] and "the one trained below" in sentence
    table = rcn.trials_table(trials).splitlines()
    assert len(table) == 2 + 4 + 1 and table[2].startswith("none")
    assert f"On {stale}: no correction" in rcn.best_sentence(trials, stale, best)
    assert stale in rcn.estimators_note(stale)
    assert drew(rcn.figure_diagnostics(trials, stale))
    assert drew(rcn.figure_estimators(trials, stale, best))
    assert drew(rcn.figure_bias_map(trials))
    explorer = rcn.weights_explorer(trials, stale)
    assert explorer.renders == 1 and 0 <= explorer.last["masked_share"] <= 1
    explorer.controls["estimator"].value = "verl geo RS"
    assert explorer.renders == 2 and explorer.last["masked_share"] > 0.5


def test_no_reward_signal_is_said_not_divided_by_zero():
    zeros = torch.zeros(4, 3)
    stats = bias_variance(zeros, zeros)  # every advantage 0: the gradients are 0
    assert stats["no_signal"] and stats["z"] == 0 and not rcn.biased(stats)
    silent = verdict_trials(none_z=0.0, best_z=0.0)
    silent["sources"][rcn.stale_name(4)]["estimators"]["none"]["no_signal"] = True
    assert "earns no reward" in rcn.not_shown(silent, rcn.stale_name(4))
    assert rcn.verdict(silent, rcn.stale_name(4), "verl token TIS (default)") == (False, False)  # nothing measured
