"""nb31_logit_softcapping: the cap modes, the step-0 KL on the tiny Gemma-2-style model both ways, the verdict made
False on bug-free numbers, metrics(), figures and the explorer."""

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.experiments.checkpoints import load
from workbench.pitfalls import nb31_logit_softcapping as sc
from workbench.tasks import rl_problems

FIX, UNSLOTH, NONE = sc.CAP_MODES


@pytest.fixture(scope="module")
def rows():
    policy, tokenizer = load("tiny-gemma2")
    assert policy.config.final_logit_softcapping == 30.0
    return sc.spread_sweep(policy, tokenizer, [p.prompt for p in rl_problems(8)], [1.0, 20.0])


def test_softcap_modes():
    z = torch.tensor([-120.0, -1.0, 0.0, 1.0, 120.0])
    assert sc.softcap(z, 30.0, FIX).abs().max() < 30  # bounded
    assert torch.allclose(sc.softcap(z, 30.0, UNSLOTH)[[0, 4]], z[[0, 4]].abs(), rtol=1e-3)  # saturated tanh: the "cap" returns |z|
    assert torch.equal(sc.softcap(z, 30.0, NONE), z) and torch.equal(sc.softcap(z, None, FIX), z)
    with pytest.raises(ValueError, match="mode"):
        sc.softcap(z, 30.0, "tanh")


def test_step0_kl_to_an_identical_reference(rows):
    small, wide = rows
    assert wide[UNSLOTH]["kl"] > 1e-2 and wide[NONE]["kl"] > 1e-2  # the signature with the switch on
    assert all(r[FIX]["kl"] <= 1e-6 for r in rows)  # the model's own cap: KL 0 up to float noise
    assert wide[NONE]["min_logprob_policy"] < wide[FIX]["min_logprob_policy"]  # uncapped log-probs of sampled tokens fall lower
    assert small[UNSLOTH]["kl"] > 1e-2  # z·tanh(z/c) ≈ z²/c: wrong even far below the cap
    assert sc.verdict(rows) == (True, True)


def row(spread: float, kl: dict) -> dict:
    return {"spread": spread, **{m: {"kl": kl[m], "k3": kl[m], "cap": 30.0, "max_raw_logit": 4 * spread, "min_logprob_policy": -3.0}
                                 for m in sc.CAP_MODES}}


def test_verdict_is_false_on_bug_free_numbers():
    capped = [row(1.0, {FIX: 0.0, UNSLOTH: 0.0, NONE: 0.0}), row(20.0, {FIX: 0.0, UNSLOTH: 1e-7, NONE: 1e-7})]
    assert sc.verdict(capped) == (False, True)
    assert "every path agrees" in sc.headline_sentence(capped)
    broken_fix = [row(20.0, {FIX: 0.1, UNSLOTH: 1.0, NONE: 1.0})]
    assert sc.verdict(broken_fix) == (True, False)


def test_metrics_figures_and_explorer(rows, tmp_path):
    kwargs = sc.metrics(rows)
    check_metrics(kwargs, "31_logit_softcapping")
    assert kwargs["headline"]["bug"] == rows[-1][UNSLOTH]["kl"] and kwargs["headline"]["fix"] == rows[-1][FIX]["kl"]
    assert drew(sc.figure_softcapping(rows))
    assert len(sc.sweep_lines(rows).splitlines()) == len(rows)
    explorer = sc.softcap_explorer(30.0)
    assert explorer.renders == 1 and abs(explorer.last[FIX]) < 30 < explorer.last[UNSLOTH]
    explorer.controls["c"].value = 10.0
    assert explorer.renders == 2 and abs(explorer.last[FIX]) <= 10
