"""nb40_resume_kl_reference: k3 by hand, the resumed reference on the tiny model (bug: the resumed policy; fix: π_0),
a short real run resumed twice (slow), the verdict both ways, metrics(), printers, figures and the explorer."""

import copy
import math

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.pitfalls import nb40_resume_kl_reference as rk
from workbench.tasks import rl_problems
from workbench.viz import legibility


def test_k3_by_hand():
    values = rk.k3(torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -1.0]))  # r = 0 and r = 1
    assert values[0] == 0 and values[1] == pytest.approx(math.e - 2)


def test_resume_builds_the_reference_from_the_resumed_policy_only_with_the_bug(qwen):
    model, _ = qwen
    trained = copy.deepcopy(model)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01)
    optimizer = torch.optim.Adam(trained.parameters(), lr=1e-3)
    checkpoint = rk.checkpoint_of(trained, optimizer)
    for ref, anchor in (("resumed", trained), ("initial", model)):
        policy, _, reference = rk.resume(model, checkpoint, lr=1e-3, reference_from=ref, initial=model)
        assert all(torch.equal(p, q) for p, q in zip(policy.parameters(), trained.parameters(), strict=True))  # exact resume
        assert all(torch.equal(p, q) for p, q in zip(reference.parameters(), anchor.parameters(), strict=True))
        assert not any(p.requires_grad for p in reference.parameters())
    with pytest.raises(ValueError, match="reference_from"):
        rk.resume(model, checkpoint, lr=1e-3, reference_from="checkpoint", initial=model)


def test_resumes_must_fall_inside_the_run(qwen):
    model, tokenizer = qwen
    with pytest.raises(ValueError, match="resumes"):
        rk.resumed_runs(model, tokenizer, rl_problems(8), steps=4, resumes=[4], seeds=[0])


@pytest.mark.slow
def test_a_real_run_resets_the_kl_the_loss_sees_at_each_resume(qwen):
    model, tokenizer = qwen
    result = rk.resumed_runs(model, tokenizer, rl_problems(32), steps=6, resumes=[2, 4], seeds=[0, 1])
    assert rk.verdict(result) == (True, True) and rk.not_shown(result) is None
    head = rk.headline_row(result)
    assert head["bug_kl_seen_at_resume"] == 0 and head["kl_initial_at_resume"] > 1e-2 and head["fix_mismatch"] == 0
    shared = [[h for h in run if h["step"] < 2] for run in result["runs"]["resumed"]]
    assert shared == [[h for h in run if h["step"] < 2] for run in result["runs"]["initial"]]  # same steps before the resume


def synthetic(bug_ref_at_resume=0.0, fix_ref_offset=0.0, kl_initial=0.5) -> dict:
    def run(ref, scale):
        out = []
        for t in range(6):
            k0 = kl_initial * t / 5 * scale
            kr = (bug_ref_at_resume if t in (2, 4) else k0 / 2) if ref == "resumed" else k0 + fix_ref_offset
            out.append({"step": t, "kl_reference": kr, "kl_initial": k0 * (1.2 if ref == "resumed" else 1.0), "reward": 0.5})
        return out
    return {"runs": {ref: [run(ref, s) for s in (1.0, 1.1)] for ref in rk.REFERENCES}, "resumes": [2, 4], "seeds": [0, 1],
            "steps": 6, "beta": 0.2}


def test_verdict_fails_on_bug_free_and_unfixed_numbers():
    assert rk.verdict(synthetic()) == (True, True)
    assert rk.verdict(synthetic(bug_ref_at_resume=0.3))[0] is False  # the loss still sees the KL after a resume
    assert rk.verdict(synthetic(kl_initial=1e-4))[0] is False  # nothing to lose at the resumes
    assert "from π_0 at the resumes" in rk.not_shown(synthetic(kl_initial=1e-4))
    assert rk.verdict(synthetic(fix_ref_offset=0.1))[1] is False  # the fix's reference is not π_0


def test_metrics_printers_figures_and_explorer():
    result = synthetic()
    kwargs = rk.metrics(result)
    check_metrics(kwargs, "40_resume_kl_reference")
    assert kwargs["reproduced"] and kwargs["fixed"] and kwargs["headline"]["bug"] == 0 and kwargs["headline"]["fix"] > 0
    assert len(rk.resume_lines(result).splitlines()) == 2 and "resume at step 4" in rk.resume_lines(result)
    assert "(fixed)" in rk.headline_sentence(result) and "[2, 4]" in rk.resume_note(result)
    fig = rk.figure_resume_kl(result)
    assert legibility.check_figure(fig).problems() == [] and drew(fig)
    explorer = rk.resume_explorer(result)
    assert explorer.renders == 1 and explorer.last["measure"] == "kl_reference"
    explorer.controls["measure"].value = "kl_initial"
    assert explorer.renders == 2 and explorer.last["bug_last"] == pytest.approx(0.6)
