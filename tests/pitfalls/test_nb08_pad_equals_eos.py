"""nb08_pad_equals_eos: metrics(), figures and the SFT-mask explorer."""

from pitfall_fakes import check_metrics, drew

from workbench.pitfalls import nb08_pad_equals_eos as pad_eos
from workbench.tasks import Problem

PROBLEMS = [Problem("1+2=", "3"), Problem("12+3=", "15")]
STATS = {True: {"finished_fraction": 0.0, "mean_length": 16.0, "accuracy": 0.0},
         False: {"finished_fraction": 1.0, "mean_length": 2.0, "accuracy": 0.5}}


def test_metrics_returns_write_metrics_arguments(tokenizer):
    kwargs = pad_eos.metrics(stats=STATS, kept=pad_eos.eos_kept(tokenizer, PROBLEMS))
    check_metrics(kwargs, "08_pad_equals_eos")
    assert kwargs["reproduced"] and kwargs["fixed"] and kwargs["not_shown"] is None
    assert kwargs["metrics"]["eos_targets_kept"] == {"bug": 0, "fix": 2}


def test_figures_draw(tokenizer):
    assert drew(pad_eos.figure_sft_masks(tokenizer, PROBLEMS))
    assert drew(pad_eos.figure_stopping(STATS))
    assert "pad_equals_eos=True: 0% stop" in pad_eos.stopping_lines(STATS)


def test_pad_eos_explorer_counts_eos_targets(tokenizer):
    explorer = pad_eos.pad_eos_explorer(tokenizer, PROBLEMS)
    assert explorer.last["eos_kept"] == 0
    explorer.controls["pad_equals_eos"].value = False
    assert explorer.last["eos_kept"] == 2
