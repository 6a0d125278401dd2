"""nb44_speculative_acceptance: each acceptance rule's emitted distribution against hand-computed values, the Monte Carlo
against the exact distribution, the verdict on numbers, metrics(), the figure, the lines and the explorer; the tiny
policy and draft end to end."""

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.pitfalls import nb44_speculative_acceptance as p44

P = torch.tensor([[0.5, 0.3, 0.2]])
Q = torch.tensor([[0.2, 0.2, 0.6]])


def test_emitted_distributions_by_hand():
    exact = p44.emitted_distribution(P, Q, "rejection")  # a = (1, 1, 1/3); residual (0.3, 0.1, 0) / 0.4
    assert torch.allclose(exact["out"], P) and float(exact["acceptance_rate"]) == pytest.approx(0.6)
    resample = p44.emitted_distribution(P, Q, "resample_target")["out"]  # 0.2 each accepted + 0.4 · p
    assert torch.allclose(resample, torch.tensor([[0.4, 0.32, 0.28]]))
    assert float(p44.total_variation(resample, P)) == pytest.approx(0.1)
    typical = p44.emitted_distribution(P, Q, "typical")  # H(p) = 1.030, 0.3 e^-H = 0.107 > ε = 0.09: all accepted
    assert torch.allclose(typical["out"], Q) and float(typical["acceptance_rate"]) == pytest.approx(1.0)
    assert float(p44.total_variation(typical["out"], P)) == pytest.approx(0.4)
    peaked = torch.tensor([[0.6, 0.35, 0.05]])  # H = 0.824: threshold min(0.09, 0.132); the third token is rejected
    assert torch.allclose(p44.emitted_distribution(peaked, Q, "typical")["out"], torch.tensor([[0.8, 0.2, 0.0]]))  # → argmax
    assert float(p44.kl(P, P)) == 0.0
    with pytest.raises(ValueError, match="unknown acceptance rule 'greedy'"):
        p44.acceptance(P, Q, "greedy")


@pytest.mark.numeric
def test_monte_carlo_follows_the_exact_distribution():
    p, q = P.repeat(4, 1), Q.repeat(4, 1)
    for rule in p44.RULES:
        frequencies = p44.simulate(p, q, rule, 20000, torch.Generator().manual_seed(0))
        exact = p44.emitted_distribution(p, q, rule)["out"]
        assert float(p44.total_variation(frequencies, exact).max()) < 0.02  # 20 000 draws: s.e. of a share ≤ 0.0035


def fake_effects(bug_tv: float = 0.17) -> dict:
    rules = {}
    for rule, tv, empirical in (("rejection", 0.0, [0.024, 0.023, 0.024]), ("typical", bug_tv, [bug_tv + 0.001] * 2 + [bug_tv]),
                                ("resample_target", 0.06, [0.065, 0.068, 0.066])):
        mean, se = p44.mean_and_se(empirical)
        rules[rule] = {"tv_exact": tv, "tv_exact_per_context": torch.tensor([tv, tv / 2]), "kl_exact": tv, "acceptance_rate": 0.9,
                       "reported_logprob_shift": 0.1, "tv_empirical": empirical, "tv_empirical_mean": mean, "tv_empirical_se": se}
    floor_mean, floor_se = p44.mean_and_se([0.024, 0.025, 0.023])
    return {"contexts": 2, "trials": 256, "seeds": [0, 1, 2], "floor": [0.024, 0.025, 0.023], "floor_mean": floor_mean,
            "floor_se": floor_se, "rules": rules}


def test_verdict_on_bug_present_and_absent_numbers():
    effects = fake_effects()
    assert p44.verdict(effects) == (True, True) and p44.verdict(effects, "resample_target") == (True, True)
    quiet = fake_effects(bug_tv=0.005)  # within the noise floor's reach and below the 0.01 signature
    quiet["rules"]["typical"].update(tv_empirical_mean=0.024, tv_empirical_se=0.001)
    assert p44.verdict(quiet) == (False, True) and "TV 0.005" in p44.not_shown(quiet)
    broken = fake_effects()
    broken["rules"]["rejection"].update(tv_exact=0.05, tv_empirical_mean=0.07)
    assert p44.verdict(broken) == (True, False)


def test_metrics_figure_lines_and_explorer(tokenizer):
    effects = fake_effects()
    kwargs = p44.metrics(effects)
    check_metrics(kwargs, "44_speculative_acceptance")
    assert (kwargs["reproduced"], kwargs["fixed"], kwargs["not_shown"]) == (True, True, None)
    assert kwargs["headline"] == {"what": "exact TV of the emitted tokens from the target policy", "unit": "TV", "bug": 0.17, "fix": 0.0}
    assert "tv_exact_per_context" not in kwargs["metrics"]["rules"]["typical"]
    torch.manual_seed(0)
    vocab = len(tokenizer)
    dists = {"p": torch.softmax(torch.randn(2, vocab), -1), "q": torch.softmax(torch.randn(2, vocab), -1)}
    assert drew(p44.figure_speculative(effects, dists, tokenizer))
    lines = p44.effects_lines(effects).splitlines()
    assert lines[0].startswith("2 contexts, 256 draws each, seeds [0, 1, 2]: noise floor TV 0.0240 ± 0.0006")
    assert "typical acceptance: TV exact 0.1700" in lines[2]
    explorer = p44.context_explorer(dists, tokenizer)
    assert explorer.renders == 1 and explorer.last["rule"] == "typical" and explorer.last["tv"] > 0
    explorer.controls["rule"].value = "rejection"
    assert explorer.renders == 2 and explorer.last["tv"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.slow
def test_p44_tiny_policy_and_draft_reproduce_and_fix():
    from workbench.experiments.checkpoints import load

    policy, tokenizer = load("tiny-arith-qwen2")
    draft, name = p44.load_draft("auto", "tiny-arith-qwen2", policy)
    assert name == "tiny-arith-gpt2"
    dists = p44.step_distributions(policy, draft, tokenizer, 12)
    effects = p44.rule_effects(dists, 128, [0, 1])
    assert effects["rules"]["rejection"]["tv_exact"] < 1e-5 and effects["rules"]["typical"]["tv_exact"] > 0.05
    assert p44.verdict(effects) == (True, True)
