"""``check_grad_accumulation``: do accumulated micro-batch losses give the full-batch token-mean gradient (P10)?

::

    loss_fn(per_token_loss: Tensor[b, T], mask: Tensor[b, T], num_items_in_batch: int,
            gradient_accumulation_steps: int) -> Tensor[]

is the loss of **one** micro-batch whose ``.backward()`` is accumulated over
``gradient_accumulation_steps`` micro-batches; ``num_items_in_batch`` is the number of real tokens
in the whole accumulated batch (what the Hugging Face Trainer passes to ``compute_loss``).
Gradients add, so the accumulated gradient with respect to each token's loss is the sum over
micro-batches of that token's weight. The check splits a ragged batch (lengths sorted, so
micro-batches hold very different token counts) into micro-batches and measures each token's
weight with row-constant inputs; the full-batch token mean gives every token 1/N.

The 2024 bug: each micro-batch's own token mean divided by the number of micro-batches — tokens
of short micro-batches weigh more. The fix divides each micro-batch's token sum by N.
"""

from __future__ import annotations

import math

import torch

from workbench.audit.result import AuditResult
from workbench.audit.signatures import first_call, require_signature, require_tensor

EXPECTED = ("loss_fn(per_token_loss: Tensor[b, T], mask: Tensor[b, T], num_items_in_batch: int, "
            "gradient_accumulation_steps: int) -> Tensor[]")
LENGTHS = (1, 2, 2, 3, 6, 7, 8, 8)
T = 8


def check_grad_accumulation(loss_fn, *, lengths=LENGTHS, micro_batches: int = 4, tol: float = 1e-5) -> AuditResult:
    """P10: relative error of the accumulated per-token gradient vs the full-batch token mean (module doc).

    ``details``: ``relative_gradient_error`` (the metric), ``token_weights`` (per row, × N: 1 is the
    full-batch weight), ``weight_spread`` (largest / smallest token weight), ``micro_batch_tokens``.
    """
    require_signature(loss_fn, "check_grad_accumulation", EXPECTED, 4)
    lengths = list(lengths)
    if len(lengths) % micro_batches:
        raise ValueError(f"{len(lengths)} rows do not split into {micro_batches} micro-batches")
    mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).float()
    total = int(sum(lengths))
    chunks = torch.arange(len(lengths)).chunk(micro_batches)
    calls = {"n": 0}

    def accumulated(values: list[float]) -> float:
        x = torch.tensor(values, dtype=torch.float32)[:, None].expand(mask.shape).contiguous()
        out = 0.0
        for rows in chunks:
            args = (x[rows], mask[rows], total, micro_batches)
            loss = first_call(loss_fn, "check_grad_accumulation", EXPECTED, *args) if calls["n"] == 0 else loss_fn(*args)
            calls["n"] += 1
            if isinstance(loss, torch.Tensor) and loss.numel() == 1:
                loss = loss.reshape(())
            out += float(require_tensor(loss, "check_grad_accumulation", EXPECTED, shape=()).detach().double())
        return out

    bias = accumulated([0.0] * len(lengths))
    row_weights = []
    for i in range(len(lengths)):
        onehot = [0.0] * len(lengths)
        onehot[i] = 1.0
        row_weights.append(accumulated(onehot) - bias)
    token_weights = [w / n for w, n in zip(row_weights, lengths, strict=True)]  # per token of row i
    reference = 1.0 / total
    error = math.sqrt(sum(n * (w - reference) ** 2 for w, n in zip(token_weights, lengths, strict=True)))
    error /= math.sqrt(sum(n * reference**2 for n in lengths))
    spread = max(token_weights) / min(token_weights) if min(token_weights) > 0 else math.inf
    micro_tokens = [int(sum(lengths[int(r)] for r in rows)) for rows in chunks]
    per_micro_mean = all(
        math.isclose(token_weights[int(r)], 1 / (micro_batches * micro_tokens[k]), rel_tol=1e-4)
        for k, rows in enumerate(chunks) for r in rows
    )
    passed = error <= tol and abs(bias) <= 1e-6
    if passed:
        convention = "global token mean (each micro-batch's sum / tokens of the accumulated batch)"
    elif per_micro_mean:
        convention = "mean of per-micro-batch token means (short micro-batches weigh more)"
    else:
        convention = "another weighting than the full-batch token mean"
    details = {
        "metric": "relative gradient error vs the full-batch token mean",
        "value": error,
        "relative_gradient_error": error,
        "weight_spread": spread,
        "token_weights_times_n": [w * total for w in token_weights],
        "lengths": lengths,
        "micro_batches": micro_batches,
        "micro_batch_tokens": micro_tokens,
        "num_items_in_batch": total,
        "plot": {
            "kind": "bar",
            "x": [f"#{i}\nL={n}" for i, n in enumerate(lengths, 1)],  # lengths repeat: the index tells sequences apart
            "series": {"accumulated weight per token × N": [w * total for w in token_weights],
                       "full-batch token mean": [1.0] * len(lengths)},
            "xlabel": f"sequence ({micro_batches} micro-batches of {len(lengths) // micro_batches})",
            "ylabel": "gradient weight per token × N",
            "title": f"relative gradient error {error:.3g}",
        },
    }
    return AuditResult("grad_accumulation", passed, convention, details)
