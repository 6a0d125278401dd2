"""nb10_grad_accumulation: metrics(), the figure and the accumulation explorer."""

import torch
from pitfall_fakes import check_metrics, drew

from workbench.core.batching import pad_sequences
from workbench.pitfalls import nb10_grad_accumulation as ga
from workbench.pitfalls import nb10_grad_accumulation as grad_accumulation

COUNTS = [1, 2, 4]
ERRORS = {"per_micro_batch": [0.0, 0.1, 0.3], "global": [0.0, 1e-8, 2e-8]}


def test_metrics_returns_write_metrics_arguments():
    kwargs = ga.metrics(micro_batch_counts=COUNTS, errors=ERRORS)
    check_metrics(kwargs, "10_grad_accumulation")
    assert kwargs["reproduced"] and kwargs["fixed"]
    assert kwargs["metrics"]["relative_gradient_error_bug"] == {"1": 0.0, "2": 0.1, "4": 0.3}
    assert kwargs["headline"]["what"] == "relative gradient error with 4 micro-batches"


def test_figure_draws():
    assert drew(ga.figure_gradient_error(COUNTS, ERRORS))
    assert " 4 micro-batches: relative error 3.00e-01" in ga.error_lines(COUNTS, ERRORS)


def test_grad_accumulation_explorer_weights_tokens():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]])
    explorer = ga.grad_accumulation_explorer(mask, [1, 2, 4])
    assert explorer.last["tokens"] == [2, 4, 1, 3]
    explorer.controls["micro_batches"].value = 1
    assert explorer.last["bug_weights"] == [explorer.last["fix_weight"]]


def test_p10_accumulation_bug_and_fix(qwen):
    model, tokenizer = qwen
    rows = [[1] + [5] * n for n in (2, 2, 3, 3, 20, 24, 30, 31)]
    ids, mask = pad_sequences(rows, 0, side="right")
    advantages = torch.tensor([1.0, -1.0] * 4)
    full = grad_accumulation.full_batch_gradient(model, ids, mask, advantages)
    bug = grad_accumulation.accumulated_gradient(model, ids, mask, advantages, micro_batches=4, normalization="per_micro_batch")
    fix = grad_accumulation.accumulated_gradient(model, ids, mask, advantages, micro_batches=4, normalization="global")
    assert grad_accumulation.relative_error(bug, full) > 0.1
    assert grad_accumulation.relative_error(fix, full) < 1e-5
