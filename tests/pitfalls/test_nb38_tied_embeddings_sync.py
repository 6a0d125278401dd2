"""nb38_tied_embeddings_sync: the untied sampler copy and both payloads on the tiny tied model, a short real sync run
(slow), the verdict both ways, not_shown for an untied checkpoint, metrics(), printers, figures and the explorer."""

import copy

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.pitfalls import nb38_tied_embeddings_sync as ts
from workbench.tasks import rl_problems
from workbench.viz import legibility


def test_the_single_name_payload_leaves_an_untied_head_stale(qwen):
    model, _ = qwen
    assert ts.is_tied(model) and not ts.is_tied(ts.untied_copy(model))
    trainer = copy.deepcopy(model)
    with torch.no_grad():
        trainer.get_input_embeddings().weight.add_(0.01)  # a step that moved the tied tensor: embedding and head at once
    assert ts.HEAD not in ts.named_payload(trainer) and ts.HEAD in ts.aliased_payload(trainer)
    ids = torch.tensor([[1, 20, 21, 22, 23]])
    for payload, stale in (("named", True), ("aliased", False)):
        sampler = ts.untied_copy(model)
        ts.push_for(payload)(trainer, sampler)
        assert torch.equal(sampler.get_input_embeddings().weight, trainer.get_input_embeddings().weight)  # always arrives
        assert (ts.head_staleness(trainer, sampler) > 5e-3) is stale  # the head: only with every name
        with torch.no_grad():
            gap = float((sampler(input_ids=ids).logits - trainer(input_ids=ids).logits).abs().max())
        assert (gap > 1e-3) is stale and (stale or gap < 1e-5)
    with pytest.raises(ValueError, match="payload"):
        ts.push_for("embed_only")


@pytest.mark.slow
def test_a_real_run_grows_the_gap_only_with_the_single_name_payload(qwen):
    model, tokenizer = qwen
    result = ts.sync_runs(model, tokenizer, rl_problems(32), seeds=[0, 1], steps=6)
    assert ts.verdict(result) == (True, True) and ts.not_shown(result) is None
    head = ts.headline_row(result)
    assert head["bug"] > 1e-2 and head["fix_max"] < 1e-4 and head["none"] > head["bug"]
    assert ts.final(result, "named", "embed_staleness") == 0 and ts.final(result, "aliased", "head_staleness") == 0


def synthetic(bug_gaps, *, tied=True, head_stale=0.01, fix_gaps=(0.0, 1e-7, 1e-7, 1e-7)) -> dict:
    def runs(gaps, head, scale=(1.0, 1.2)):
        histories = [[{"step": t, "gap": g * s, "kl": g, "drift": g} for t, g in enumerate(gaps)] for s in scale]
        for run in histories:
            run[-1].update(head_staleness=head, embed_staleness=0.0)
        return histories
    return {"runs": {"named": runs(bug_gaps, head_stale), "aliased": runs(fix_gaps, 0.0), "none": runs([0, 1, 2, 3], 0.1)},
            "sent": {"named": {"tensors": 38, "has_head": False, "has_embed": True},
                     "aliased": {"tensors": 39, "has_head": True, "has_embed": True}},
            "tied": tied, "seeds": [0, 1], "steps": 4}


def test_verdict_fails_on_bug_free_and_unfixed_numbers():
    grows = [0.0, 0.02, 0.04, 0.06]
    assert ts.verdict(synthetic(grows)) == (True, True)
    assert ts.verdict(synthetic(grows, head_stale=0.0))[0] is False  # the head arrived: no signature
    assert ts.verdict(synthetic([0.0, 1e-3, 1e-3, 1e-3]))[0] is False  # a gap too small to tell
    assert ts.verdict(synthetic(grows, fix_gaps=grows))[1] is False  # the fix still drifts
    untied = synthetic(grows, tied=False)
    assert ts.verdict(untied)[0] is False and "tie_word_embeddings is False" in ts.not_shown(untied)


def test_metrics_printers_figures_and_explorer():
    result = synthetic([0.0, 0.02, 0.04, 0.06])
    kwargs = ts.metrics(result)
    check_metrics(kwargs, "38_tied_embeddings_sync")
    assert kwargs["reproduced"] and kwargs["fixed"] and kwargs["metrics"]["staleness"]["named"]["head_staleness"] == 0.01
    assert "lm_head.weight missing" in ts.payload_lines(result) and "lm_head.weight sent" in ts.payload_lines(result)
    assert "(fixed)" in ts.headline_sentence(result) and "never synced" in ts.headline_sentence(result)
    assert "not drawn" in ts.tied_note(result)
    fig = ts.figure_tied_sync(result)
    assert legibility.check_figure(fig).problems() == [] and drew(fig)
    explorer = ts.tied_explorer(result)
    assert explorer.renders == 1 and explorer.last["bug_last"] == pytest.approx(0.06)
    explorer.controls["seed"].value = 1
    assert explorer.renders == 2 and explorer.last["bug_last"] == pytest.approx(0.072)


def test_not_shown_names_a_trainer_that_never_moved():
    flat = synthetic([0.0, 1e-7, 1e-7, 1e-7])
    for runs in flat["runs"].values():
        for run in runs:
            for h in run:
                h.update(reward=0.0, reward_spread=0.0)
    assert "every REINFORCE advantage is 0" in ts.not_shown(flat)
