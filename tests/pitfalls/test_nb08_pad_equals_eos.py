"""nb08_pad_equals_eos: metrics(), figures and the SFT-mask explorer."""

import pytest
from pitfall_fakes import check_metrics, drew

from workbench.pitfalls import nb08_pad_equals_eos as pad_eos
from workbench.pitfalls import nb10_grad_accumulation as grad_accumulation
from workbench.pitfalls import nb13_whitening as whitening
from workbench.tasks import TEST_PROMPTS, TRAIN_PROMPTS, Problem, load_problems

PROBLEMS = [Problem("1+2=", "3"), Problem("12+3=", "15")]
STATS = {True: {"finished_fraction": 0.0, "mean_length": 16.0, "accuracy": 0.0},
         False: {"finished_fraction": 1.0, "mean_length": 2.0, "accuracy": 0.5}}


def test_metrics_returns_write_metrics_arguments(tokenizer):
    kwargs = pad_eos.metrics(stats=STATS, kept=pad_eos.eos_kept(pad_eos.sft_masks(tokenizer, PROBLEMS)))
    check_metrics(kwargs, "08_pad_equals_eos")
    assert kwargs["reproduced"] and kwargs["fixed"] and kwargs["not_shown"] is None
    assert kwargs["metrics"]["eos_targets_kept"] == {"bug": 0, "fix": 2}


def test_figures_draw(tokenizer):
    assert drew(pad_eos.figure_sft_masks(pad_eos.sft_masks(tokenizer, PROBLEMS), tokenizer.eos_token_id))
    assert drew(pad_eos.figure_stopping(STATS))
    assert "pad_equals_eos=True: 0% stop" in pad_eos.stopping_lines(STATS)


def test_pad_eos_explorer_counts_eos_targets(tokenizer):
    explorer = pad_eos.pad_eos_explorer(pad_eos.sft_masks(tokenizer, PROBLEMS), tokenizer.eos_token_id)
    assert explorer.last["eos_kept"] == 0
    explorer.controls["pad_equals_eos"].value = False
    assert explorer.last["eos_kept"] == 2


@pytest.mark.slow  # full training / realistic checkpoints: make test-all
def test_p8_pad_equals_eos_never_learns_to_stop():
    problems, test = load_problems(TRAIN_PROMPTS), load_problems(TEST_PROMPTS)[:32]
    stats = {}
    for bug in (False, True):
        model, tokenizer, _ = pad_eos.sft_run(problems, pad_equals_eos=bug, steps=60)
        stats[bug] = pad_eos.stopping_stats(model, tokenizer, test)
    assert stats[True]["finished_fraction"] == 0.0 and stats[True]["mean_length"] == 16
    assert stats[False]["finished_fraction"] > 0.9


def test_pad_eos_and_accumulation_and_whitening_verdicts():
    stops = {"finished_fraction": 1.0}
    assert pad_eos.verdict({True: stops, False: stops}) == (False, True)
    assert pad_eos.verdict({True: {"finished_fraction": 0.0}, False: {"finished_fraction": 0.5}}) == (True, False)
    assert "only 50% of greedy answers stop" in pad_eos.not_shown({True: {"finished_fraction": 0.0}, False: {"finished_fraction": 0.5}})
    assert pad_eos.not_shown({True: {"finished_fraction": 0.0}, False: stops}) is None
    assert grad_accumulation.verdict({"per_micro_batch": [0.0, 1e-7], "global": [0.0, 1e-7]}) == (False, True)
    centred = [{"naive_mean": 1e-8, "masked_mean": 0.0, "masked_std": 1.0}]
    assert whitening.verdict(centred) == (False, True)
    assert whitening.verdict([{"naive_mean": 0.3, "masked_mean": 0.1, "masked_std": 1.0}]) == (True, False)
