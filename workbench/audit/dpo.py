"""``check_dpo_mask``: which rows of a concatenated ``[chosen; rejected]`` DPO batch count prompt tokens (S4).

The callable is the reduction every DPO trainer has somewhere (OpenRLHF ``_get_batch_logps``,
TRL's ``completion_mask`` sum, the workbench's ``build_loss_mask`` + sum)::

    batch_logps_fn(token_logps: Tensor[2B, T-1], attention_mask: Tensor[2B, T],
                   prompt_lengths: list[int]) -> Tensor[2B]

``token_logps[r, t]`` is log p of token t+1 of row r; rows 0..B−1 are prompt+chosen, rows
B..2B−1 prompt+rejected of the same B prompts, right-padded; ``prompt_lengths`` has B entries
(tokens of each pair's prompt). It returns each row's sequence log-prob.

The check feeds one-hot ``token_logps`` (1 at target column t in every row, 0 elsewhere) and reads
which rows count which targets. Prompt targets (t < prompt_length − 1) must weigh 0 on **both**
sides; OpenRLHF's zip over 2B mask rows and B prompt lengths masked only the chosen prompts.
Passes when no row counts a prompt or padding target and every response target counts.
"""

from __future__ import annotations

import torch

from workbench.audit.result import AuditResult
from workbench.audit.signatures import first_call, require_signature, require_tensor

EXPECTED = ("batch_logps_fn(token_logps: Tensor[2B, T-1], attention_mask: Tensor[2B, T], "
            "prompt_lengths: list[int]) -> Tensor[2B]")
PROMPT_LENGTHS = [2, 3, 4]
CHOSEN_LENGTHS = [3, 2, 4]
REJECTED_LENGTHS = [2, 4, 1]


def crafted_batch(prompt_lengths=PROMPT_LENGTHS, chosen=CHOSEN_LENGTHS, rejected=REJECTED_LENGTHS) -> torch.Tensor:
    """The right-padded attention mask (2B, T) of the crafted preference batch."""
    totals = [p + c for p, c in zip(prompt_lengths, chosen, strict=True)]
    totals += [p + r for p, r in zip(prompt_lengths, rejected, strict=True)]
    return (torch.arange(max(totals))[None] < torch.tensor(totals)[:, None]).long()


def target_roles(attention_mask: torch.Tensor, prompt_lengths: list[int]) -> list[list[str]]:
    """For every row and target column: ``"prompt"``, ``"response"`` or ``"pad"``."""
    lengths = prompt_lengths * 2
    roles = []
    for r, row in enumerate(attention_mask):
        total = int(row.sum())
        roles.append(["prompt" if t + 1 < lengths[r] else "response" if t + 1 < total else "pad"
                      for t in range(attention_mask.shape[1] - 1)])
    return roles


def check_dpo_mask(batch_logps_fn, *, prompt_lengths=PROMPT_LENGTHS, chosen_lengths=CHOSEN_LENGTHS,
                   rejected_lengths=REJECTED_LENGTHS) -> AuditResult:
    """S4: which rows of ``[chosen; rejected]`` count their prompt tokens (see module doc).

    ``details``: ``prompt_tokens_counted`` per side (``chosen``, ``rejected``), ``response_reduction``
    (``sum`` or ``mean``), ``weights`` (2B × (T−1) matrix the plot shows).
    """
    require_signature(batch_logps_fn, "check_dpo_mask", EXPECTED, 3)
    mask = crafted_batch(prompt_lengths, chosen_lengths, rejected_lengths)
    rows, targets = mask.shape[0], mask.shape[1] - 1
    b = len(prompt_lengths)
    calls = {"n": 0}

    def call(token_logps: torch.Tensor) -> torch.Tensor:
        args = (token_logps, mask.clone(), list(prompt_lengths))
        out = first_call(batch_logps_fn, "check_dpo_mask", EXPECTED, *args) if calls["n"] == 0 else batch_logps_fn(*args)
        calls["n"] += 1
        return require_tensor(out, "check_dpo_mask", EXPECTED, shape=(rows,)).detach().double()

    bias = call(torch.zeros(rows, targets))
    columns = []
    for t in range(targets):
        onehot = torch.zeros(rows, targets)
        onehot[:, t] = 1.0
        columns.append(call(onehot) - bias)
    weights = torch.stack(columns, dim=1)  # (2B, T-1)
    roles = target_roles(mask, prompt_lengths)
    counted = weights.abs() > 1e-6
    prompt_counts = [sum(bool(counted[r, t]) for t in range(targets) if roles[r][t] == "prompt") for r in range(rows)]
    pad_counts = [sum(bool(counted[r, t]) for t in range(targets) if roles[r][t] == "pad") for r in range(rows)]
    response = [[float(weights[r, t]) for t in range(targets) if roles[r][t] == "response"] for r in range(rows)]
    if all(abs(w - 1) < 1e-5 for row in response for w in row):
        reduction = "sum"
    elif all(abs(w - 1 / len(row)) < 1e-5 for row in response for w in row):
        reduction = "mean"
    else:
        reduction = "other"
    chosen_rows, rejected_rows = prompt_counts[:b], prompt_counts[b:]
    prompt_targets = [p - 1 for p in prompt_lengths]
    if not any(prompt_counts):
        convention = "prompts masked on both sides"
    elif not any(chosen_rows) and rejected_rows == prompt_targets:
        convention = "chosen prompts only (rejected rows keep their prompt: zip over B lengths for 2B rows)"
    elif chosen_rows == prompt_targets and rejected_rows == prompt_targets:
        convention = "prompts counted on both sides"
    else:
        convention = "irregular prompt masking"
    all_responses_counted = all(abs(w) > 1e-6 for row in response for w in row)
    passed = not any(prompt_counts) and not any(pad_counts) and all_responses_counted and abs(float(bias.abs().max())) < 1e-6
    if not all_responses_counted:
        convention += "; some response tokens are not counted"
    if any(pad_counts):
        convention += "; padding targets counted"
    details = {
        "metric": "prompt tokens in the loss (chosen + rejected)",
        "value": sum(prompt_counts),
        "prompt_tokens_counted": {"chosen": sum(chosen_rows), "rejected": sum(rejected_rows)},
        "prompt_tokens_by_row": prompt_counts,
        "padding_tokens_counted": sum(pad_counts),
        "response_reduction": reduction,
        "prompt_lengths": list(prompt_lengths),
        "chosen_lengths": list(chosen_lengths),
        "rejected_lengths": list(rejected_lengths),
        "weights": weights.tolist(),
        "plot": {
            "kind": "bar",
            "x": [f"{'c' if r < b else 'r'}{r % b}" for r in range(rows)],
            "series": {"prompt tokens counted": prompt_counts, "prompt targets": prompt_targets * 2},
            "xlabel": "row (c = chosen, r = rejected)",
            "ylabel": "prompt targets in the sequence log-prob",
            "title": f"DPO mask: {convention}",
        },
    }
    return AuditResult("dpo_mask", passed, convention, details)
