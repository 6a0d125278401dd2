"""Notebook 21's pitfall module: the figure, the explorer and the metrics the notebook writes."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.experiments import checkpoints
from workbench.modeling import models  # noqa: E402
from workbench.pitfalls import nb21_duplicate_bos as p21  # noqa: E402
from workbench.tasks import rl_problems  # noqa: E402

PROMPTS = [p.prompt for p in rl_problems(4)]


@pytest.fixture(scope="module")
def llama_shift():
    model, tokenizer = checkpoints.load("realistic-llama-chat", dtype=None, device="cpu", pad_token="keep")
    return model, tokenizer, p21.response_shift(model, tokenizer, PROMPTS, max_new_tokens=6)


def test_log_ratio_explorer_redraws_for_another_encoding(llama_shift):
    explorer = p21.log_ratio_explorer(llama_shift[2])
    assert explorer.last["leading_bos"] == 2 and explorer.last["mean_abs_log_ratio"] > 1e-3
    explorer.controls["how"].value = p21.FIX_PATH
    assert explorer.renders == 2 and explorer.last["leading_bos"] == 1 and explorer.last["max_ratio_deviation"] == 0.0


def test_figure_draws_the_histogram_and_the_zero_line(llama_shift):
    shift = llama_shift[2]
    fig, ax = plt.subplots()
    p21.plot_log_ratio(ax, shift)
    assert len(ax.patches) == 40 and ax.lines[0].get_xdata()[0] == 0  # 40 bins, the fix's line at 0
    assert ax.get_legend().get_texts()[1].get_text().endswith("all exactly 0 (fix)")  # the same ids score the same
    plt.close(fig)
    fig = p21.figure_log_ratio(shift)
    assert len(fig.axes) == 1
    plt.close(fig)
    assert "two BOS (bug)" in p21.caption_note()


def test_metrics_are_write_metrics_arguments(llama_shift, tmp_path):
    model, tokenizer, shift = llama_shift
    greedy = p21.greedy_comparison(model, tokenizer, PROMPTS)
    assert set(greedy["answers"]) == {"template ids", p21.BUG_PATH} and 0 <= greedy["changed_fraction"] <= 1
    written = written_metrics(p21.metrics(shift, greedy, tokenizer), tmp_path)
    assert (written["reproduced"], written["fixed"]) == (True, True)
    assert set(written["metrics"]["paths"]) == set(p21.ENCODINGS) and "log_ratio" not in written["metrics"]["paths"][p21.BUG_PATH]
    assert written["headline"]["bug"] == pytest.approx(shift["paths"][p21.BUG_PATH]["mean_abs_log_ratio"])
    assert "examples:" in p21.greedy_lines(greedy) and p21.shift_lines(shift).endswith("True")
    assert p21.encoding_lines(tokenizer).count("\n") == len(p21.ENCODINGS) - 1


def test_p21_bos_counting_and_guard_by_hand():
    from workbench.pitfalls import nb21_duplicate_bos as p21

    assert p21.leading_bos([7, 7, 3, 7], 7) == 2 and p21.leading_bos([3, 7], 7) == 0 and p21.leading_bos([5], None) == 0
    assert p21.strip_duplicate_bos([7, 7, 7, 3], 7) == [7, 3] and p21.strip_duplicate_bos([7, 3], 7) == [7, 3]


def test_p21_audit_finds_the_two_bos_path_only_on_the_llama_like_tokenizer():
    from workbench.modeling import realistic
    from workbench.pitfalls import nb21_duplicate_bos as p21

    llama = p21.bos_audit(models.load_tokenizer(realistic.checkpoint("llama")))
    assert llama["tokenizer_adds_bos"] and llama["template_writes_bos"]
    assert llama["leading_bos"] == {"template ids": 1, "text + tokenizer()": 2, "text + tokenizer(add_special_tokens=False)": 1}
    qwen = p21.bos_audit(models.load_tokenizer(realistic.checkpoint("qwen2")))
    assert set(qwen["leading_bos"].values()) == {0}


def test_p21_two_bos_shift_the_log_probs_and_one_bos_does_not():
    from workbench.pitfalls import nb21_duplicate_bos as p21
    from workbench.tasks import rl_problems

    model, tokenizer = checkpoints.load("realistic-llama-chat", dtype=None, device="cpu", pad_token="keep")
    shift = p21.response_shift(model, tokenizer, [p.prompt for p in rl_problems(8)], max_new_tokens=8)
    bug, fix = shift["paths"]["text + tokenizer()"], shift["paths"]["text + tokenizer(add_special_tokens=False)"]
    assert bug["leading_bos"] == 2 and bug["mean_abs_log_ratio"] > 1e-2
    assert fix["leading_bos"] == 1 and fix["max_ratio_deviation"] == 0.0 and shift["guard_recovers_template_ids"]
    assert p21.verdict(bug, fix) == (True, True)


def test_p21_verdict_false_on_bug_absent_numbers():
    from workbench.pitfalls import nb21_duplicate_bos as p21

    one_bos = {"leading_bos": 1, "mean_abs_log_ratio": 0.0, "max_ratio_deviation": 0.0}
    assert p21.verdict(one_bos, one_bos) == (False, True)
    two_bos_no_shift = {"leading_bos": 2, "mean_abs_log_ratio": 0.0, "max_ratio_deviation": 0.0}
    assert p21.verdict(two_bos_no_shift, two_bos_no_shift) == (False, False)
