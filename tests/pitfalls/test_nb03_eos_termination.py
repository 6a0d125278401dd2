"""nb03_eos_termination: metrics(), figures, the PPO reading and the decoding-cost explorer."""

import torch
from pitfall_fakes import axes, check_metrics, drew, fake_runs

from workbench.pitfalls import nb03_eos_termination as eos


def cost(steps, tokens, needed, longest):
    return {"decode_steps": steps, "tokens_generated": tokens, "tokens_needed": needed, "waste_fraction": 1 - needed / tokens,
            "seconds": 0.01, "longest_response": longest, "finished_fraction": 1.0}


COSTS = {b: {"bug": cost(8, 8 * b, 3 * b, 4), "fix": cost(4, 4 * b, 3 * b, 4)} for b in (1, 4)}
MASKS = {"finished": 4, "eos_kept_distinct": 4, "eos_kept_pad_is_eos": 0,
         "distinct": (torch.tensor([[5, 2, 0]]), torch.tensor([[1, 1, 0]])),
         "pad_is_eos": (torch.tensor([[5, 2, 2]]), torch.tensor([[1, 0, 0]]))}


def reading(runs: dict) -> dict:
    """``metrics``' arguments read from the PPO runs."""
    return {"split": eos.ppo_split(runs), "effects": eos.ppo_effects(runs)}


def test_metrics_returns_write_metrics_arguments():
    runs = fake_runs(eos.PPO_VARIANTS, ("reward", "tokens_generated", "rollout_seconds"), seeds=1)
    kwargs = eos.metrics(costs=COSTS, loss_gap=0.0, masks=MASKS, **reading(runs))
    check_metrics(kwargs, "03_eos_termination")
    assert kwargs["reproduced"] and kwargs["fixed"] and kwargs["not_shown"] is None
    assert kwargs["headline"]["what"] == "decoding steps per batch of 4 rollouts" and kwargs["headline"]["bug"] == 8
    assert kwargs["metrics"]["ppo_first_split_step"] == 0 and abs(kwargs["metrics"]["ppo_curve_reward_gap"] - 0.1) < 1e-9


def test_ppo_reading_names_the_first_split():
    runs = fake_runs(eos.PPO_VARIANTS, ("reward",), seeds=1)
    runs[next(iter(eos.PPO_VARIANTS))] = [[dict(h) for h in runs["stop_at_eos=True (fix)"][0]]]
    assert eos.ppo_split(runs) == (None, 0.0)
    assert eos.ppo_sentence(eos.ppo_split(runs), 4) == "identical rewards at every one of the 4 steps"
    assert eos.ppo_sentence((3, 0.25), 4) == ("identical rewards up to step 2, then rounding differences grow into different "
                                              "samples (largest gap 2.50e-01)")
    assert eos.ppo_sentence((0, 0.25), 4) == "the rewards differ from the first step on (largest gap 2.50e-01)"


def test_figures_draw():
    assert drew(eos.figure_generation_cost(COSTS))
    assert drew(eos.figure_pad_eos_masks(MASKS, eos_token_id=2))
    assert drew(eos.figure_ppo(fake_runs(eos.PPO_VARIANTS, ("reward", "tokens_generated", "rollout_seconds"), seeds=1)))
    assert "seed 3" in eos.ppo_note(3) and "max_new_tokens = 48" in eos.generation_cost_note(48)
    assert "first 16 responses" in eos.pad_eos_note()
    fig, ax = axes(3)
    eos.plot_ppo(ax, fake_runs(eos.PPO_VARIANTS, ("reward", "tokens_generated", "rollout_seconds"), seeds=1))
    assert drew(fig)
    assert "batch    4" in eos.cost_lines(COSTS)


def test_eos_explorer_reports_cost_for_the_chosen_budget():
    from workbench.experiments.checkpoints import load

    model, tokenizer = load("tiny-arith-qwen2")
    explorer = eos.eos_explorer(model, tokenizer, ["1+2=", "12+34=", "5*5=", "9-3="])
    explorer.controls["batch_size"].value = 4
    explorer.controls["max_new_tokens"].value = 10
    assert explorer.last["bug"]["decode_steps"] == 10 > explorer.last["fix"]["decode_steps"]


def test_one_step_line_reads_the_gap_against_the_precision_tolerance():
    fix, bug = {"tokens_generated": 400, "tokens_needed": 256}, {"tokens_generated": 768}
    line = eos.one_step_line(fix, bug, 7.9e-9)
    assert "7.90e-09 (the same step up to float rounding: tolerance 1e-06 in fp32)" in line
    assert "768 (bug) vs 400 (fix), 256 needed" in line
    assert "a different step" in eos.one_step_line(fix, bug, 1.5e-4) and "float rounding" in eos.one_step_line(
        fix, bug, 1.5e-4, "bf16-mixed")


def test_the_one_seed_training_summary_names_its_noise():
    runs = fake_runs(eos.PPO_VARIANTS, ("reward", "tokens_generated"), seeds=1, steps=8)
    for step, record in enumerate(runs["stop_at_eos=False (bug)"][0]):
        record["tokens_generated"] += 40 + 3 * (step % 3)  # the bug generates more, by a step-to-step varying amount
    summary = eos.training_lines(eos.ppo_effects(runs), runs, "sums")
    assert "step-to-step standard deviations from 0" in summary and "± std" in summary
    assert "seed noise" not in summary and "standard errors" not in summary and "s.e." not in summary
    three = fake_runs(eos.PPO_VARIANTS, ("reward", "tokens_generated"), seeds=3)
    assert "± s.e." in eos.training_lines(eos.ppo_effects(three), three, "sums")


def test_eos_verdict():
    def cost(steps, generated, needed, longest):
        return {"decode_steps": steps, "tokens_generated": generated, "tokens_needed": needed, "longest_response": longest}

    stops = {8: {"bug": cost(5, 40, 30, 5), "fix": cost(5, 40, 30, 5)}}  # a bug-free "bug" run
    assert eos.verdict(stops, 0.0) == (False, True)
    wasteful = {8: {"bug": cost(32, 256, 30, 5), "fix": cost(5, 40, 30, 5)}}
    assert eos.verdict(wasteful, 0.0) == (True, True)
    assert eos.verdict(wasteful, 1e-3) == (True, False)


def test_missing_eos_note_follows_the_counts():
    import torch

    from workbench.pitfalls import nb03_eos_termination as eos

    finished = torch.tensor([True, True, False, False])
    note = eos.missing_eos_note(torch.tensor([1.0, 0.0, 0.0, 0.0]), finished, 1.0)
    assert "2/4 responses truncated" in note and "1 of them wrong" in note and "below the finished-but-wrong" in note
    assert "not below" in eos.missing_eos_note(torch.tensor([1.0, 0.0, 0.0, 0.0]), finished, 0.0)
    assert "no finished-but-wrong" in eos.missing_eos_note(torch.tensor([1.0, 1.0, 0.0, 0.0]), finished, 1.0)
    assert "changes nothing" in eos.missing_eos_note(torch.tensor([1.0, 0.0]), torch.tensor([True, True]), 1.0)


def test_the_one_step_tolerance_follows_the_trainers_precision():
    """Under bf16 autocast the step with and without decoding past EOS moved by 1.5e-4 on an H200 (two batch widths,
    bf16 kernels): float noise there, a failure in fp32."""
    import pytest

    runs = fake_runs(eos.PPO_VARIANTS, ("reward", "tokens_generated", "rollout_seconds"), seeds=1)
    assert not eos.metrics(costs=COSTS, loss_gap=1.5e-4, masks=MASKS, **reading(runs))["fixed"]
    mixed = eos.metrics(costs=COSTS, loss_gap=1.5e-4, masks=MASKS, **reading(runs), precision="bf16-mixed")
    assert mixed["fixed"] and mixed["metrics"]["one_step_loss_tolerance"] == eos.LOSS_TOLERANCE["bf16-mixed"]
    assert not eos.metrics(costs=COSTS, loss_gap=0.05, masks=MASKS, **reading(runs), precision="bf16")["fixed"]
    with pytest.raises(ValueError, match="precision='fp64'.*use one of"):
        eos.metrics(costs=COSTS, loss_gap=0.0, masks=MASKS, **reading(runs), precision="fp64")
