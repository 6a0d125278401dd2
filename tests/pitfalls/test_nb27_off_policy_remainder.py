"""nb27_off_policy_remainder: the schedule against TRL PR #3493's timeline, both guards on every small setting, a real
GRPO run on the tiny model with each guard, the verdict both ways, metrics(), figures and the explorer."""

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.experiments.checkpoints import load
from workbench.pitfalls import nb27_off_policy_remainder as rm
from workbench.tasks import rl_problems
from workbench.viz import legibility


def test_schedule_matches_the_timeline_of_the_pr():
    """steps_per_generation 3, GA 4 (TRL PR #3493): the optimiser steps after micro-step 3, so micro-steps 4 and 5
    train π₁ on π₀'s batch; after the step at 7, micro-step 8 trains π₂ on π₁'s; the batch sampled at 9 is on-policy."""
    rows = rm.schedule(3, 4, 12)
    assert [r["micro_step"] for r in rows if r["lag"] > 0] == [4, 5, 8]
    assert {r["lag"] for r in rows} == {0, 1}
    assert rows[4]["generated_by"] == 0 and rows[4]["trained_by"] == 1 and rows[4]["slice"] == 1
    assert rm.off_policy_share(3, 4) == pytest.approx(3 / 12)
    assert rm.off_policy_share(2, 4) == 0 and rm.off_policy_share(8, 4) == pytest.approx(0.5)


def test_the_new_guard_snapshots_exactly_when_a_batch_is_split_and_the_old_one_misses_the_remainder_cases():
    missed = []
    for spg in range(1, 13):
        for ga in range(1, 13):
            split = rm.off_policy_share(spg, ga) > 0
            assert rm.snapshots_old_logprobs(spg, ga, guard="trl-0.20") == split, (spg, ga)
            if split and not rm.snapshots_old_logprobs(spg, ga, guard="trl-0.19"):
                missed.append((spg, ga))
    # the old guard (num_iterations > 1 or spg > GA) misses exactly spg < GA with GA not a multiple of spg
    assert missed == [(s, g) for s in range(1, 13) for g in range(1, 13) if s < g and g % s]
    assert (3, 4) in missed and len(missed) == 43  # of the 144 settings with both in 1..12
    assert rm.snapshots_old_logprobs(2, 4, num_iterations=2, guard="trl-0.19")  # several iterations: both snapshot


def test_guard_and_counts_name_the_problem():
    with pytest.raises(ValueError, match="guard"):
        rm.snapshots_old_logprobs(3, 4, guard="trl-0.18")
    with pytest.raises(ValueError, match="steps_per_generation=0"):
        rm.snapshots_old_logprobs(0, 4)


@pytest.fixture(scope="module")
def rows():
    policy, tokenizer = load("tiny-arith-qwen2")
    return rm.steps_per_generation_sweep(policy, tokenizer, rl_problems(16), [3], gradient_accumulation_steps=4, micro_steps=8,
                                         prompts_per_slice=2, group_size=4, lr=3e-4, clip=0.2, seed=0)


def test_the_remainder_is_trained_with_ratio_one_under_the_old_guard_and_with_the_true_ratio_under_the_new(rows):
    fix, bug = rows  # GUARDS order: the fix first
    assert (fix["guard"], bug["guard"]) == ("trl-0.20", "trl-0.19") and fix["snapshot"] and not bug["snapshot"]
    assert [s["micro_step"] for s in bug["steps"] if s["lag"]] == [4, 5]  # real optimiser steps, counted by the run
    # switch on (bug): the policy moved, tokens left the clip window, the loss saw ratio 1 everywhere
    assert bug["mean_abs_log_ratio"] > 1e-2 and bug["true_clip_fraction"] > 0
    assert bug["seen_clip_fraction"] == 0 and bug["logged_clip_fraction"] == 0
    assert torch.all(bug["seen_log_ratio"] == 0) and bug["max_weight_error"] > 0.1
    # switch off (fix): every micro-step's ratio is the one against the sampler's log-probs (fp32 both)
    assert fix["max_weight_error"] < 1e-4 and fix["seen_clip_fraction"] == fix["true_clip_fraction"] > 0
    # the on-policy micro-steps agree in both runs: before the first optimiser step nothing differs
    assert all(abs(s["true_log_ratio"]).max() < 1e-4 for s in bug["steps"][:4])
    assert rm.verdict(rows) == (True, True)


def synthetic_row(guard: str, spg: int, ga: int, shift: float) -> dict:
    """A run whose off-policy micro-steps moved the policy by up to ``shift`` nats per token (8 tokens each)."""
    keep_old = rm.snapshots_old_logprobs(spg, ga, guard=guard)
    steps = []
    for s in rm.schedule(spg, ga, 2 * ga):
        mu = torch.full((1, 8), -1.0)
        logp = mu + (torch.linspace(-shift, shift, 8).view(1, 8) if s["lag"] else 0)
        steps.append(rm.step_row(s["micro_step"], s["generated_by"], s["trained_by"], logp, mu if keep_old else logp, mu,
                                 torch.ones(1, 8), 0.2, 0.0))
    return rm.summarise(steps, spg, ga, guard, 0.2)


def test_verdict_is_false_without_an_off_policy_remainder():
    aligned = [synthetic_row(g, 2, 4, 0.5) for g in rm.GUARDS]  # GA a multiple of steps_per_generation: nothing is off-policy
    assert rm.verdict(aligned) == (False, True)
    assert "no setting showed the bug" in rm.headline_sentence(aligned, rm.headline_rows(aligned))
    frozen = [synthetic_row(g, 3, 4, 0.0) for g in rm.GUARDS]  # split batches, but the policy did not move
    assert rm.verdict(frozen) == (False, True)
    split = [synthetic_row(g, 3, 4, 0.5) for g in rm.GUARDS]
    assert rm.verdict(split) == (True, True)
    assert split[1]["true_clip_fraction"] == pytest.approx(5 / 8)  # outside (log 0.8, log 1.2): ±0.5, ±0.357, +0.214
    assert split[0]["seen_clip_fraction"] == pytest.approx(5 / 8) and split[1]["seen_clip_fraction"] == 0


def not_shown(rows: list[dict]) -> str | None:
    return rm.not_shown(rows, rm.headline_rows(rows)[0])


def metrics(rows: list[dict]) -> dict:
    return rm.metrics(rows, rm.headline_rows(rows))


def test_not_shown_says_when_the_policy_never_moved_and_only_then(rows):
    frozen = [synthetic_row(g, 3, 4, 0.0) for g in rm.GUARDS]  # split batches, no advantage anywhere: no gradient
    reason = not_shown(frozen)
    assert "did not move this checkpoint's policy" in reason and "every GRPO advantage was 0" in reason
    assert "at most 0.0e+00" in reason and metrics(frozen)["not_shown"] == reason
    assert not_shown(rows) is None and metrics(rows)["not_shown"] is None  # the tiny trained model shows it
    moved_inside = [synthetic_row(g, 3, 4, 0.05) for g in rm.GUARDS]  # moved, inside the window: a failed reproduction, not a blind spot
    assert rm.verdict(moved_inside) == (False, True) and not_shown(moved_inside) is None
    aligned = [synthetic_row(g, 2, 4, 0.0) for g in rm.GUARDS]  # nothing off-policy: the parameters' choice, said by the headline
    assert not_shown(aligned) is None


def test_a_checkpoint_that_earns_no_reward_records_why_it_cannot_show_the_remainder():
    """An untrained model never answers (reward 0 everywhere, like the realistic checkpoints): GRPO's advantages are all
    0, the optimiser steps leave the weights as they were, and the notebook says so instead of a silent (False, True)."""
    from workbench.modeling.tiny import tiny_model

    untrained, tokenizer = tiny_model("qwen2")
    rows = rm.steps_per_generation_sweep(untrained, tokenizer, rl_problems(16), [3], gradient_accumulation_steps=4, micro_steps=8,
                                         prompts_per_slice=2, group_size=4, lr=3e-4, clip=0.2, seed=0)
    bug = rows[1]
    assert bug["responses"] == 64 and bug["responses_with_advantage"] == 0 and bug["max_abs_log_ratio"] < 1e-4
    assert rm.verdict(rows) == (False, True)
    assert "every GRPO advantage was 0" in metrics(rows)["not_shown"]


def test_verdict_is_not_fixed_when_the_new_guard_misses_the_true_ratio():
    broken = [synthetic_row("trl-0.19", 3, 4, 0.5), {**synthetic_row("trl-0.19", 3, 4, 0.5), "guard": "trl-0.20"}]
    assert rm.verdict(broken) == (True, False)


def test_metrics_figures_and_explorer(rows):
    head = rm.headline_rows(rows)
    assert head[0] is rows[1] and head[1] is rows[0]  # GUARDS order: the fix first
    kwargs = rm.metrics(rows, head)
    check_metrics(kwargs, "27_off_policy_remainder")
    assert kwargs["headline"]["bug"] == 0 and kwargs["headline"]["fix"] == rows[0]["true_clip_fraction"] > 0
    assert all(not {"steps", "seen_log_ratio", "true_log_ratio"} & set(r) for r in kwargs["metrics"]["runs"])  # no tensors
    fig = rm.figure_remainder(rows, head, 0.2)
    assert legibility.check_figure(fig).problems() == []
    assert "steps_per_generation = " in rm.remainder_note(rows, head, 0.2)
    assert drew(fig)
    assert len(rm.sweep_lines(rows).splitlines()) == len(rows)
    explorer = rm.remainder_explorer(rows, head[0], 0.2)
    assert explorer.renders == 1 and explorer.last["guard"] == "trl-0.19" and explorer.last["seen_clip_fraction"] == 0
    explorer.controls["guard"].value = "trl-0.20"
    assert explorer.renders == 2 and explorer.last["seen_clip_fraction"] == explorer.last["true_clip_fraction"] > 0
    explorer.controls["epsilon"].value = 0.01
    assert explorer.last["true_clip_fraction"] >= rows[0]["true_clip_fraction"]
