"""The batches and the comparison the rollout-correction probes share (verl 0.9.1 and TRL 1.16 adapters).

The tensors are drawn here, from the probe's seed, inside the peer's environment: the workbench's own
tests never see them. Each case is (old_log_prob, rollout_log_prob, response_mask):

* ``heavy_tailed``: 24 rows of 2–16 tokens, log ρ Student-t (ν = 1.5, scale 0.2): most tokens close,
  a few far apart, as a bf16 sampler against an fp32 trainer gives;
* ``empty_rows``: the same with three rows of no response token;
* ``one_token_rows``: every row one token long;
* ``inf``: −inf log-probs on both sides inside the response (log ρ = ±inf) and in the padding;
* ``nan_padding``: NaN sampling log-probs in the padding only;
* ``nan``: NaN sampling log-probs inside the response and in the padding;
* ``bf16``: ``heavy_tailed`` in bfloat16.

Comparison: relative difference |a − b| / max(|a|, |b|), NaN equal to NaN and an infinity to itself.
"""

from __future__ import annotations

import math

import torch

ROWS, WIDTH = 24, 16
CASES = ("heavy_tailed", "empty_rows", "one_token_rows", "inf", "nan_padding", "nan", "bf16")


def cases(seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    old = -torch.empty(ROWS, WIDTH).exponential_(1.0, generator=generator)
    t = torch.distributions.StudentT(1.5)
    torch.manual_seed(seed)
    log_ratio = 0.2 * t.sample((ROWS, WIDTH))
    rollout = (old - log_ratio).clamp(max=0.0)
    lengths = torch.randint(2, WIDTH + 1, (ROWS,), generator=generator)
    mask = (torch.arange(WIDTH)[None] < lengths[:, None]).float()
    empty = mask.clone()
    empty[[0, 5, 11]] = 0.0
    one = torch.zeros_like(mask)
    one[:, 0] = 1.0
    inf_old, inf_rollout = old.clone(), rollout.clone()
    inf_old[1, 0] = inf_old[7, 1] = float("-inf")  # log ρ = −inf
    inf_rollout[2, 0] = inf_rollout[9, 1] = float("-inf")  # log ρ = +inf
    inf_rollout[mask == 0] = float("-inf")  # padding
    padding_nan = rollout.clone()
    padding_nan[mask == 0] = torch.where(torch.rand(int((mask == 0).sum()), generator=generator) < 0.3, float("nan"), 0.0)
    nan_rollout = padding_nan.clone()
    nan_rollout[1, 0] = nan_rollout[6, 1] = float("nan")
    return {"heavy_tailed": (old, rollout, mask), "empty_rows": (old, rollout, empty), "one_token_rows": (old, rollout, one),
            "inf": (inf_old, inf_rollout, mask), "nan_padding": (old, padding_nan, mask), "nan": (old, nan_rollout, mask),
            "bf16": (old.bfloat16(), rollout.bfloat16(), mask)}


def relative(a: float, b: float) -> float:
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))


def tensor_relative(a: torch.Tensor, b: torch.Tensor, where: torch.Tensor) -> float:
    """Largest relative difference of two tensors at the positions ``where``."""
    a, b = a.double()[where], b.double()[where]
    if a.numel() == 0:
        return 0.0
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    gap = (a - b).abs() / torch.maximum(a.abs(), b.abs())
    gap = torch.where(same, torch.zeros_like(gap), torch.nan_to_num(gap, nan=math.inf))
    return float(gap.max())


def compare_metrics(theirs: dict, ours: dict, label: str, worst: dict, examples: list) -> int:
    """Fold one pair of metric dicts into ``worst`` (largest relative difference, its metric and setting);
    returns the number of metric names only one side has. ``examples`` collects the first differences."""
    for name in sorted(set(theirs) & set(ours)):
        gap = relative(float(theirs[name]), float(ours[name]))
        if gap > worst["value"]:
            worst.update(value=gap, metric=name, setting=label)
        if gap > 1e-5 and len(examples) < 8:
            examples.append({"setting": label, "metric": name, "peer": float(theirs[name]), "workbench": float(ours[name])})
    return len(set(theirs) ^ set(ours))
