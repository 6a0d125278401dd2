"""Notebook 21's pitfall module: the figure, the explorer and the metrics the notebook writes."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.experiments import checkpoints
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
    plt.close(fig)
    fig = p21.figure_log_ratio(shift)
    assert len(fig.axes) == 1
    plt.close(fig)


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
