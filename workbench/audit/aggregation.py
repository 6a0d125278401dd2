"""``check_aggregation``: which loss reduction a ``loss_fn(per_token_loss, mask) -> scalar`` implements (S5).

The check never reads the function: it calls it on crafted ragged batches whose per-token losses
are constant along each row (what a GRPO loss is at ratio 1 and β = 0: −A_i on every token of
completion i), so even a trainer that only takes advantages can be wrapped. Feeding 1 on row i
and 0 elsewhere measures the row's total weight W_i; with L_i real tokens per row, N in the batch,
B rows:

* ``token-mean`` (TRL ``bnpo``/``dapo``): W_i = L_i / N;
* ``seq-mean-token-mean`` (TRL ``grpo``, the GRPO paper): W_i = 1 / B;
* ``seq-mean-token-sum``: W_i = L_i / B;
* ``seq-mean-token-sum-norm`` (TRL ``dr_grpo``, verl): W_i = L_i / C with C independent of the
  token count (the constant is recovered: TRL divides by B × max_completion_length, verl by T);
* anything else (a nonlinear or biased function, weight on masked positions): ``unknown``.

Three batches (different token counts, different B) separate the constant-weight cases; a fourth
holds a fully masked row and records whether it is counted in the mean over sequences (as TRL's
``grpo`` does), dropped (as ``workbench.core.losses.aggregate_loss`` does), or turns the loss into NaN.
The S5 number: the loss of a zero-mean advantage group at ratio 1, exactly 0 for
``seq-mean-token-mean`` and not 0 otherwise.
"""

from __future__ import annotations

import math

import torch

from workbench.audit.result import AuditResult
from workbench.audit.signatures import first_call, require_signature, require_tensor

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
TRL_ALIASES = {"token-mean": "bnpo/dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum": "",
               "seq-mean-token-sum-norm": "dr_grpo"}
NAME_OF_ALIAS = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm"}
EXPECTED = "loss_fn(per_token_loss: Tensor[B, T], mask: Tensor[B, T]) -> Tensor[]"
T = 8
PROBE_LENGTHS = {"main": [1, 3, 5, 8], "more_tokens": [2, 4, 6, 8], "more_rows": [1, 2, 3, 5, 7, 8]}
EMPTY_ROW_LENGTHS = [1, 3, 5, 0]
ZERO_MEAN_ADVANTAGES = [1.5, -0.5, -0.5, -0.5]  # a group with rewards [1, 0, 0, 0], centred


def canonical_mode(name: str) -> str:
    """The verl name of an aggregation mode given by verl or TRL name."""
    mode = NAME_OF_ALIAS.get(name, name)
    if mode not in MODES:
        raise ValueError(f"unknown aggregation mode {name!r}; use one of {MODES + tuple(NAME_OF_ALIAS)}")
    return mode


def ragged_mask(lengths: list[int], width: int = T) -> torch.Tensor:
    """A right-padded (B, width) float mask with ``lengths[i]`` ones in row i."""
    return (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).float()


def _close(a: float, b: float, rel: float = 1e-4) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= rel * max(abs(a), abs(b)) + 1e-7


class _Caller:
    """Calls the user's loss_fn, the first call through the signature guard."""

    def __init__(self, loss_fn):
        self.loss_fn, self.calls = loss_fn, 0

    def __call__(self, values: torch.Tensor, mask: torch.Tensor) -> float:
        if self.calls == 0:
            out = first_call(self.loss_fn, "check_aggregation", EXPECTED, values, mask)
        else:
            out = self.loss_fn(values, mask)
        self.calls += 1
        if isinstance(out, torch.Tensor) and out.numel() == 1:
            out = out.reshape(())
        out = require_tensor(out, "check_aggregation", EXPECTED, shape=())
        return float(out.detach().double())


def row_values(lengths_or_mask, values) -> torch.Tensor:
    """Per-token losses constant along each row (masked positions included), shape (B, T)."""
    mask = lengths_or_mask if isinstance(lengths_or_mask, torch.Tensor) else ragged_mask(lengths_or_mask)
    return torch.tensor(values, dtype=torch.float32)[:, None].expand(mask.shape).contiguous()


def row_weights(call, mask: torch.Tensor) -> tuple[list[float], float]:
    """Each row's total weight W_i (loss of 1 on row i minus the loss of 0), and the loss of 0."""
    b = mask.shape[0]
    bias = call(torch.zeros(mask.shape), mask)
    weights = []
    for i in range(b):
        onehot = [0.0] * b
        onehot[i] = 1.0
        weights.append(call(row_values(mask, onehot), mask) - bias)
    return weights, bias


def classify(weights: dict[str, list[float]]) -> tuple[str, dict]:
    """The mode whose weight pattern matches all probe batches, and its constant."""
    lengths = PROBE_LENGTHS
    info: dict = {}
    if all(_close(w, 1 / len(ws)) for key, ws in weights.items() for w in ws):
        return "seq-mean-token-mean", info
    constants = {}
    for key, ws in weights.items():
        ratios = [length / w if w != 0 else math.inf for length, w in zip(lengths[key], ws, strict=False)]
        if not all(_close(r, ratios[0]) for r in ratios):
            return "unknown", info
        constants[key] = ratios[0]
    info["norm_constants"] = constants
    if all(_close(c, sum(lengths[k])) for k, c in constants.items()):
        return "token-mean", info
    if all(_close(c, len(lengths[k])) for k, c in constants.items()):
        return "seq-mean-token-sum", info
    if _close(constants["main"], constants["more_tokens"]):
        c, rows = constants["main"], len(lengths["main"])
        info["norm_constant"] = c
        if _close(constants["more_rows"] / len(lengths["more_rows"]), c / rows):
            info["norm_constant_scaling"] = f"B × {c / rows:.6g}" + (" (= B × T)" if _close(c / rows, T) else "")
        else:
            info["norm_constant_scaling"] = f"fixed {c:.6g}" + (" (= T)" if _close(c, T) else "")
        return "seq-mean-token-sum-norm", info
    return "unknown", info


def empty_row_treatment(call, mode: str, info: dict) -> tuple[str, list[float]]:
    """How a fully masked row enters the mean over sequences: counted, dropped, NaN, or n/a."""
    mask = ragged_mask(EMPTY_ROW_LENGTHS)
    weights, bias = row_weights(call, mask)
    present = [(length, w) for length, w in zip(EMPTY_ROW_LENGTHS, weights, strict=False) if length > 0]
    if not all(math.isfinite(w) for w in weights) or not math.isfinite(bias):
        return "NaN (0/0 on the empty row)", weights
    b = len(EMPTY_ROW_LENGTHS)
    if mode == "seq-mean-token-mean":
        rows_counted = 1 / present[0][1]
    elif mode == "seq-mean-token-sum":
        rows_counted = present[0][0] / present[0][1]
    elif mode == "seq-mean-token-sum-norm" and info.get("norm_constant_scaling", "").startswith("B"):
        rows_counted = present[0][0] / present[0][1] / (info["norm_constant"] / len(PROBE_LENGTHS["main"]))
    else:
        return "n/a (no mean over sequences)", weights
    if _close(rows_counted, b):
        return "counted (the empty row adds 0 to a mean over all B rows, TRL grpo)", weights
    if _close(rows_counted, b - 1):
        return "dropped (the mean runs over non-empty rows only)", weights
    return f"unclear ({rows_counted:.4g} rows counted)", weights


def check_aggregation(loss_fn, expected: str | None = None) -> AuditResult:
    """Classify ``loss_fn(per_token_loss: Tensor[B, T], mask: Tensor[B, T]) -> Tensor[]`` (see module doc).

    ``expected`` (a verl or TRL name, e.g. ``"seq-mean-token-mean"`` or ``"grpo"``): the convention the
    code claims; the check then also fails when the measured one differs. ``passed`` = a known
    convention (the expected one when given) whose loss stays finite on a fully masked row.
    """
    require_signature(loss_fn, "check_aggregation", EXPECTED, 2)
    want = canonical_mode(expected) if expected is not None else None
    call = _Caller(loss_fn)
    weights, biases = {}, {}
    for key, lengths in PROBE_LENGTHS.items():
        weights[key], biases[key] = row_weights(call, ragged_mask(lengths))
    mask = ragged_mask(PROBE_LENGTHS["main"])
    leak = call(mask.new_ones(mask.shape) * (1 - mask), mask) - biases["main"]
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(len(PROBE_LENGTHS["main"]), generator=generator).tolist()
    predicted = sum(w * v for w, v in zip(weights["main"], values, strict=True))
    linear_gap = call(row_values(mask, values), mask) - biases["main"] - predicted
    mode, info = classify(weights)
    reasons = []
    if any(abs(b) > 1e-6 for b in biases.values()):
        reasons.append(f"loss of an all-zero input is {biases['main']:.4g}, not 0")
    if abs(leak) > 1e-6:
        reasons.append(f"masked positions carry weight (loss {leak:.4g} from padding alone)")
    if abs(linear_gap) > 1e-4 * max(1.0, abs(sum(values))):
        reasons.append(f"not linear in the per-token loss (gap {linear_gap:.4g})")
    if reasons:
        mode = "unknown"
    empty, empty_weights = empty_row_treatment(call, mode, info) if mode != "unknown" else ("n/a", [])
    zero_mean_loss = call(row_values(mask, [-a for a in ZERO_MEAN_ADVANTAGES]), mask) - biases["main"]
    known = mode in MODES
    finite = not empty.startswith("NaN")
    passed = known and finite and (want is None or mode == want)
    convention = mode if want is None or mode == want else f"{mode} (expected {want})"
    details = {
        "mode": mode,
        "trl_alias": TRL_ALIASES.get(mode, ""),
        "expected": want,
        "empty_rows": empty,
        "metric": "loss of a zero-mean advantage group at ρ = 1",
        "value": zero_mean_loss,
        "zero_mean_advantages": ZERO_MEAN_ADVANTAGES,
        "lengths": PROBE_LENGTHS["main"],
        "row_weights": weights["main"],
        "row_weights_all_probes": weights,
        "empty_row_probe": {"lengths": EMPTY_ROW_LENGTHS, "row_weights": empty_weights},
        "masked_position_leak": leak,
        "linearity_gap": linear_gap,
        "problems": reasons,
        **info,
        "plot": {
            "kind": "bar",
            "x": [f"L={n}" for n in PROBE_LENGTHS["main"]],
            "series": {"measured": weights["main"],
                       "token-mean": [n / sum(PROBE_LENGTHS["main"]) for n in PROBE_LENGTHS["main"]],
                       "seq-mean-token-mean": [1 / len(PROBE_LENGTHS["main"])] * len(PROBE_LENGTHS["main"])},
            "xlabel": "sequence (real tokens)",
            "ylabel": "weight of the sequence in the loss",
            "title": mode,
        },
    }
    if "norm_constant" not in details and mode == "token-mean":
        details["norm_constant"] = float(sum(PROBE_LENGTHS["main"]))
    return AuditResult("aggregation", passed, convention, details)
