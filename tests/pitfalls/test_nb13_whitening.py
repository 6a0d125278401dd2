"""Notebook 13's pitfall module: the figures it draws, its explorer and the metrics the notebook writes."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.core import losses  # noqa: E402
from workbench.experiments.checkpoints import load  # noqa: E402
from workbench.pitfalls import nb13_whitening as whitening  # noqa: E402
from workbench.tasks import rl_problems  # noqa: E402
from workbench.trainers.ppo import (
    PPOConfig,  # noqa: E402
    PPOTrainer,  # noqa: E402
)

VALUES = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def fake_runs(steps: int = 4, seeds: int = 2) -> dict:
    """Histories shaped like ``comparison.train_variants``' (bug: mean advantage 0.3 on real tokens; fix: 0)."""
    runs = {}
    for label, shift in zip(whitening.PPO_VARIANTS, (0.3, 0.0), strict=True):
        runs[label] = [[{"step": i, "advantage_mean_real_tokens": shift + 0.01 * seed, "reward": 0.1 * i + 0.02 * seed}
                        for i in range(steps)] for seed in range(seeds)]
        for seed, history in enumerate(runs[label]):
            history[-1].update(heldout_accuracy=0.5 + 0.1 * seed, heldout_accuracy_start=0.4)
    return runs


def test_whitening_explorer_redraws_with_more_padding():
    explorer = whitening.whitening_explorer(VALUES, MASK)
    before = explorer.last["naive_mean"]
    explorer.controls["extra"].value = 32
    assert explorer.renders == 2
    assert abs(explorer.last["naive_mean"]) > abs(before) and abs(explorer.last["masked_mean"]) < 1e-6


def test_figures_draw_their_panels():
    rows = whitening.whitening_vs_padding(VALUES, MASK, [0, 4])
    fig = whitening.figure_whitening_vs_padding(rows)
    assert [len(ax.lines) for ax in fig.axes] == [3, 3]  # naive, masked, target line
    plt.close(fig)
    fig = whitening.figure_ppo_whitening(fake_runs(), ppo_steps=4)
    assert len(fig.axes) == 3 and all(ax.has_data() for ax in fig.axes)
    plt.close(fig)


def test_metrics_are_write_metrics_arguments(tmp_path):
    rows = whitening.whitening_vs_padding(VALUES, MASK, [0, 4, 16])
    runs = fake_runs()
    effects = whitening.ppo_effects(runs)
    assert set(effects) == set(whitening.EFFECT_KEYS) | {whitening.PREDICTION.measure}
    absolute = effects["advantage_abs_mean_real_tokens"]  # the prediction's measure is |advantage mean|, seed by seed
    signed = effects["advantage_mean_real_tokens"]
    assert absolute.bug == pytest.approx(abs(signed.bug)) and absolute.difference == pytest.approx(abs(signed.bug) - abs(signed.fix))
    written = written_metrics(whitening.metrics(rows, runs, effects, {"steps": 4}, task="sums"), tmp_path)
    prediction = written["metrics"]["prediction"]
    assert prediction["measure"] == "advantage_abs_mean_real_tokens" and prediction["task"] == "sums"
    assert prediction["effect"] == pytest.approx(absolute.difference) and prediction["direction"] == "+"
    assert written["notebook"] == "13_whitening" and (written["reproduced"], written["fixed"]) == whitening.verdict(rows)
    assert set(written["metrics"]["naive_mean_by_padding"]) == {"0", "4", "16"}
    assert written["metrics"]["ppo_advantage_mean_real_tokens"] == {k: h[0][0]["advantage_mean_real_tokens"] for k, h in runs.items()}
    worst = max(rows, key=lambda r: abs(r["naive_mean"]))
    assert written["headline"]["bug"] == worst["naive_mean"] and written["headline"]["fix"] == worst["masked_mean"]
    assert "+16 pads" in whitening.padding_lines(rows)


def test_p13_whitening_over_padding_is_polluted():
    values = torch.tensor([[1.0, 2.0, 3.0, 0.0, 0.0], [4.0, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    naive = whitening.real_token_stats(losses.naive_whiten(values) * mask, mask)
    masked = whitening.real_token_stats(losses.masked_whiten(values, mask), mask)
    assert abs(naive["mean"]) > 0.5
    assert abs(masked["mean"]) < 1e-6 and masked["std"] == pytest.approx(1.0, abs=1e-4)
    rows = whitening.whitening_vs_padding(values, mask, [0, 10])
    assert abs(rows[1]["naive_mean"]) > abs(rows[0]["naive_mean"])  # more padding, worse
    assert rows[1]["masked_mean"] == pytest.approx(rows[0]["masked_mean"], abs=1e-6)


def test_p13_ppo_switch():
    runs = {}
    for over in ("padded", "real"):
        model, tokenizer = load("tiny-arith-qwen2")
        config = PPOConfig(steps=1, whiten_over=over, progress=False, prompts_per_step=16, mini_batches=1)
        runs[over] = PPOTrainer(model, tokenizer, rl_problems(32), config).train()[0]
    assert abs(runs["padded"]["advantage_mean_real_tokens"]) > 1e-2
    assert abs(runs["real"]["advantage_mean_real_tokens"]) < 1e-6
