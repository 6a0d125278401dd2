"""Notebook 16's pitfall module: the figures, the explorer and the metrics the notebook writes."""

import matplotlib

matplotlib.use("Agg")

import math  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.pitfalls import nb16_group_statistics as gs  # noqa: E402
from workbench.tasks import rl_problems  # noqa: E402


@pytest.fixture(scope="module")
def measured():
    singleton = gs.singleton_sweep([0.5, 0.95], 8)
    spreads = [1e-3, 1.0]
    errors = gs.precision_sweep(spreads)
    rewards = torch.tensor([float(i % 3 == 0) for i in range(64)]).reshape(8, 8)
    partial = gs.partial_group_sweep(rewards, [0.1, 0.25], 8)
    return singleton, spreads, errors, partial


def test_singleton_advantage_explorer_redraws_on_a_control_change():
    explorer = gs.singleton_advantage_explorer(8)
    assert explorer.renders == 1 and abs(explorer.last["one-pass"]) > 10 * 0.95  # the fp32 one-pass residue at v = 0.95
    explorer.controls["v"].value = 0.5
    assert explorer.renders == 2 and explorer.last["value"] == 0.5
    assert explorer.last["two-pass + floor"] == pytest.approx(-0.5, abs=1e-4)


def test_figures_draw_on_their_axes(measured):
    singleton, spreads, errors, partial = measured
    fig = gs.figure_group_statistics(singleton, spreads, errors, partial)
    assert len(fig.axes) == 3 and all(ax.has_data() for ax in fig.axes)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["exact", "one-pass (bug)", "two-pass",
                                                                             "two-pass + floor (fix)"]  # short: rings say the rest
    plt.close(fig)
    assert gs.caption_note(8).startswith("Top left: the group [0, v × 7] in fp32")
    fig, ax = plt.subplots()
    gs.plot_singleton_advantages(ax, singleton[0])
    assert len(ax.patches) == 3 and len(ax.lines) == 1  # one bar per std, the exact value's line
    plt.close(fig)


def test_metrics_are_write_metrics_arguments(measured, tmp_path):
    singleton, spreads, errors, partial = measured
    head, worst = gs.headline_rows(singleton, partial)
    written = written_metrics(gs.metrics(singleton, errors, partial, head, worst), tmp_path)
    assert head["value"] == 0.95 and worst["misgrouped_fraction"] == max(r["misgrouped_fraction"] for r in partial)
    assert written["reproduced"] == gs.verdict(head, worst)[0]
    assert set(written["metrics"]["singleton_advantage"]) == {"0.5", "0.95"}
    assert written["headline"]["bug"] == pytest.approx(head["one-pass"])
    assert "rewards of 0.95 in fp32" in gs.cancellation_line(head, 8)
    assert gs.headline_sentence(head, worst).startswith("[0, 0.95 × 7]: A = ")
    assert len(gs.sweep_lines(singleton, spreads, errors, partial).splitlines()) == len(singleton) + len(errors) + len(partial)


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
