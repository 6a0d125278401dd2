"""Notebook 15's pitfall module: the figure, the explorer and the metrics the notebook writes."""

import matplotlib

matplotlib.use("Agg")

import math  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.pitfalls import nb15_temperature_entropy as te  # noqa: E402
from workbench.tasks import rl_problems  # noqa: E402

PROMPTS = [p.prompt for p in rl_problems(8)]


def test_entropy_temperature_explorer_redraws_on_a_control_change(qwen):
    explorer = te.entropy_temperature_explorer(te.last_position_logits(*qwen, PROMPTS[0]))
    assert abs(explorer.last["entropy_gap"]) > 1e-4  # τ = 0.7 at start
    explorer.controls["temperature"].value = 1.0
    assert explorer.renders == 2 and explorer.last["entropy_gap"] == pytest.approx(0.0, abs=1e-6)


def test_figure_and_metrics(qwen, tmp_path):
    rows = te.sweep(*qwen, PROMPTS, [0.5, 1.0])
    fig = te.figure_entropy_vs_temperature(rows)
    assert len(fig.axes) == 2 and all(len(ax.lines) >= 2 for ax in fig.axes)
    plt.close(fig)
    head = te.headline_row(rows, headline_temperature=0.6)
    assert head is rows[0]  # 0.5 is nearest 0.6
    written = written_metrics(te.metrics(rows, head), tmp_path)
    assert (written["reproduced"], written["fixed"]) == te.verdict(rows)
    assert set(written["metrics"]["entropy_raw"]) == {"0.5", "1.0"}
    assert written["metrics"]["entropy_gap_at_headline_temperature"] == pytest.approx(rows[0]["entropy_gap"])
    assert written["headline"]["what"].endswith("(τ = 0.5)")
    assert te.headline_sentence(rows, head).startswith("At τ = 0.5:")
    fix_kl = max(abs(r["fix"]["kl_exact"]) for r in rows)
    assert te.caption_note(rows).endswith("exactly 0 at every τ." if fix_kl == 0 else "(0 up to float rounding) at every τ.")


CATALOGUE_PROMPTS = [p.prompt for p in rl_problems(32)]  # the catalogue's checks ran on 32 prompts


def test_p15_entropy_and_kl_at_temperature_by_hand():
    from workbench.pitfalls.nb15_temperature_entropy import entropy_at_temperature, kl_between_temperatures

    logits = torch.tensor([0.0, math.log(3.0)])  # τ = 1: [1/4, 3/4]; τ = 0.5: [1/10, 9/10]
    h1 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    h05 = -(0.1 * math.log(0.1) + 0.9 * math.log(0.9))
    assert float(entropy_at_temperature(logits, 1.0)) == pytest.approx(h1, abs=1e-6)
    assert float(entropy_at_temperature(logits, 0.5)) == pytest.approx(h05, abs=1e-6)
    kl = 0.1 * math.log(0.1 / 0.25) + 0.9 * math.log(0.9 / 0.75)
    assert float(kl_between_temperatures(logits, 0.5, 1.0)) == pytest.approx(kl, abs=1e-6)
    assert float(kl_between_temperatures(logits, 0.5, 0.5)) == pytest.approx(0.0, abs=1e-7)


def test_p15_entropy_gap_and_step0_kl_vanish_with_the_fix(qwen):
    from workbench.pitfalls import nb15_temperature_entropy as te

    model, tokenizer = qwen
    rows = te.sweep(model, tokenizer, CATALOGUE_PROMPTS, [0.7, 1.0])
    cold, one = rows
    assert cold["entropy_gap"] > 0.01 and cold["bug"]["kl_exact"] > 1e-3 and cold["bug"]["kl_k3"] > 1e-3
    assert cold["fix"]["kl_exact"] == pytest.approx(0, abs=1e-6) and cold["fix"]["kl_k1"] == pytest.approx(0, abs=1e-6)
    assert abs(one["entropy_gap"]) < 1e-6 and abs(one["bug"]["kl_exact"]) < 1e-6  # τ = 1: nothing to see
    assert te.verdict(rows) == (True, True)
    assert te.verdict([one])[0] is False


def test_p15_verdict_says_false_on_bug_absent_numbers():
    from workbench.pitfalls.nb15_temperature_entropy import verdict

    clean = {"temperature": 0.7, "entropy_gap": 0.0, "bug": {"kl_exact": 0.0}, "fix": {"kl_exact": 0.0, "kl_k1": 0.0}}
    assert verdict([clean]) == (False, True)
    residue = {"temperature": 0.7, "entropy_gap": 0.1, "bug": {"kl_exact": 0.02}, "fix": {"kl_exact": 0.01, "kl_k1": 0.0}}
    assert verdict([residue]) == (True, False)
