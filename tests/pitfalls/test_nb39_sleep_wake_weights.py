"""nb39_sleep_wake_weights: the engine's weight life cycle on the tiny model (level 1 and 2, reload from disk, load from
the trainer), the bug's and the fix's wake, a short real run (slow), the verdict both ways, metrics(), printers, figures
and the explorer."""

import copy

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.pitfalls import nb39_sleep_wake_weights as sw
from workbench.tasks import rl_problems
from workbench.viz import legibility


def same(model, state) -> bool:
    return all(torch.equal(p, state[n]) for n, p in model.named_parameters())


def test_engine_life_cycle(qwen):
    model, _ = qwen
    engine = sw.Engine(copy.deepcopy(model))
    trained = {n: p.detach() + 0.01 for n, p in model.named_parameters()}
    engine.load_weights(trained)
    engine.sleep(1)
    engine.wake_up()
    assert engine.source == "trainer" and same(engine.model, trained)  # level 1: the offloaded copy comes back
    engine.sleep(2)
    engine.wake_up()
    assert engine.weights_dropped and all(float(p.detach().abs().max()) == 0 for p in engine.model.parameters())  # level 2: gone
    engine.reload_weights()
    assert engine.source == "disk" and same(engine.model, dict(model.named_parameters()))  # the checkpoint, not the trainer's
    with pytest.raises(ValueError, match="level"):
        engine.sleep(3)
    with pytest.raises(ValueError, match="wake"):
        sw.hooks_for(engine, model, "no_reload")


def test_the_bugs_wake_overwrites_the_sync_and_the_fixs_does_not(qwen):
    model, _ = qwen
    trainer = copy.deepcopy(model)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.01)  # one update
    for wake, source in (("disk_reload", "disk"), ("trainer_reload", "trainer")):
        engine = sw.Engine(copy.deepcopy(model))
        push, before, after = sw.hooks_for(engine, model, wake)
        after(engine.model, 0)  # sleep (level 2) after the first rollout
        push(trainer, engine.model)  # the sync writes the trainer's weights
        after(engine.model, 0)  # and the engine sleeps again before the next generate (TRL's order varies; the wake decides)
        before(engine.model, 1)  # generate(): wake
        assert engine.sampled_with == [source]
        assert same(engine.model, dict((model if source == "disk" else trainer).named_parameters()))


@pytest.mark.slow
def test_a_real_run_pins_the_bugs_engine_to_the_checkpoint(qwen):
    model, tokenizer = qwen
    result = sw.sleep_runs(model, tokenizer, rl_problems(32), seeds=[0, 1], steps=4)
    assert sw.verdict(result) == (True, True) and sw.not_shown(result) is None
    head = sw.headline_row(result)
    assert head["bug"] > 0.1 and head["fix_max"] < 1e-4 and head["drift_match"] < 1e-4  # the bug's gap is the drift from π_0


def synthetic(bug_gaps, *, bug_source="disk", fix_gaps=(0.0, 1e-7, 1e-7, 1e-7), fix_source="trainer") -> dict:
    def runs(gaps, source):
        return [[{"step": t, "gap": g * s, "kl": g, "drift": g, "sampled_with": source} for t, g in enumerate(gaps)]
                for s in (1.0, 1.2)]
    return {"runs": {"disk_reload": runs(bug_gaps, bug_source), "trainer_reload": runs(fix_gaps, fix_source)},
            "seeds": [0, 1], "steps": 4, "level": 2}


def test_verdict_fails_on_bug_free_and_unfixed_numbers():
    grows = [0.0, 0.3, 0.5, 0.8]
    assert sw.verdict(synthetic(grows)) == (True, True)
    assert sw.verdict(synthetic([0.0, 1e-7, 1e-7, 1e-7], bug_source="trainer"))[0] is False  # the sync's weights were sampled
    assert sw.verdict(synthetic([0.0, 1e-3, 1e-3, 1e-3]))[0] is False  # the trainer barely moved
    assert "moved too little" in sw.not_shown(synthetic([0.0, 1e-3, 1e-3, 1e-3]))
    assert sw.verdict(synthetic(grows, fix_source="undefined"))[1] is False  # the fix sampled dropped weights
    assert sw.verdict(synthetic(grows, fix_gaps=grows))[1] is False


def test_metrics_printers_figures_and_explorer():
    result = synthetic([0.0, 0.3, 0.5, 0.8])
    kwargs = sw.metrics(result)
    check_metrics(kwargs, "39_sleep_wake_weights")
    assert kwargs["reproduced"] and kwargs["fixed"] and kwargs["metrics"]["sampled_with"]["disk_reload"] == {"disk": 8}
    assert "cumem" in kwargs["metrics"]["engine_cpu"]
    assert "step 1: sampled with disk weights" in sw.lifecycle_lines(result)
    assert "(fixed)" in sw.headline_sentence(result) and "0.015 → 0.201" in sw.headline_sentence(result)
    assert "level 2" in sw.sleep_note(result)
    fig = sw.figure_sleep_wake(result)
    assert legibility.check_figure(fig).problems() == [] and drew(fig)
    explorer = sw.sleep_explorer(result)
    assert explorer.renders == 1 and explorer.last["bug_last"] == pytest.approx(0.8)
    explorer.controls["measure"].value = "drift"
    assert explorer.renders == 2 and explorer.last["bug_last"] == pytest.approx(0.8)
