"""Pitfall P18: logged metrics averaged over padding, or with a sentinel log-prob.

A batch of responses is a (B, R) grid: real tokens, then pads after each row's EOS. The scorer returns
a value at every cell, pads included (the log-prob of a pad token, the entropy of the distribution
at a pad position), and some trainers keep a sentinel there. A statistic taken over the whole grid
mixes these cells in, so the logged number depends on how many pad columns the batch happened to get:

* plain means over the grid: mean entropy, mean KL, mean ratio (the trainer's own loss may be masked
  correctly — TRL #6803/#6809 list Online DPO and PPO statistics that were not);
* a sentinel: TRL's PPO filled pad log-probs with INVALID_LOGPROB = 1.0 and logged the entropy as
  Σ_t −log π(a_t) per sequence, so each pad added −1 and the "entropy" went negative (TRL #2022,
  #2281; fixed in PR #6121 by multiplying by the mask).

The fix: every statistic is Σ(value · mask) / Σ mask (per token) or Σ_t value · mask per sequence, and
a pad-invariance test: adding pad columns to a batch must not move any logged number (TRL PR #6654).
"""

from __future__ import annotations

import torch

from workbench.core.losses import masked_mean
from workbench.modeling.rollout import Rollout, sample
from workbench.modeling.scoring import response_logprobs
from workbench.tasks import encode_prompts
from workbench.viz.plots import note_coinciding

INVALID_LOGPROB = 1.0  # TRL PPO's sentinel for pad positions
MODES = ("unmasked", "sentinel", "masked")


def rollout_for(model, tokenizer, prompts: list[str], seed: int = 0, max_new_tokens: int = 6) -> Rollout:
    ids, mask = encode_prompts(tokenizer, prompts)
    return sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed))


def widen(rollout: Rollout, extra: int, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rollout's responses with ``extra`` more pad columns: ``(response_ids, response_mask, old_logprobs)``."""
    b = rollout.response_ids.shape[0]
    ids = torch.cat([rollout.response_ids, torch.full((b, extra), pad_token_id, dtype=torch.long)], 1)
    mask = torch.cat([rollout.response_mask, torch.zeros((b, extra), dtype=torch.long)], 1)
    old = torch.cat([rollout.rollout_logprobs, torch.zeros((b, extra))], 1)  # stored as 0 where masked
    return ids, mask, old


def logged_metrics(logprobs, ref_logprobs, old_logprobs, entropy, mask) -> dict:
    """The same four statistics three ways: ``unmasked`` (plain means over the grid), ``sentinel``
    (pad log-probs set to INVALID_LOGPROB, then plain means / per-sequence sums), ``masked`` (fix).

    ``entropy``: mean per-token entropy of the policy; ``kl``: mean k1 = log π − log π_ref;
    ``ratio``: mean π/π_old; ``sequence_entropy``: mean over rows of Σ_t −log π(a_t) (TRL PPO's estimate).
    """
    mask = mask.float()
    pad = ~mask.bool()
    out = {"unmasked": {"entropy": entropy.mean(), "kl": (logprobs - ref_logprobs).mean(),
                        "ratio": (logprobs - old_logprobs).exp().mean(), "sequence_entropy": (-logprobs).sum(1).mean()}}
    lp, ref = logprobs.masked_fill(pad, INVALID_LOGPROB), ref_logprobs.masked_fill(pad, INVALID_LOGPROB)
    old = old_logprobs.masked_fill(pad, INVALID_LOGPROB)
    out["sentinel"] = {"entropy": entropy.masked_fill(pad, 0).mean(), "kl": (lp - ref).mean(),
                       "ratio": (lp - old).exp().mean(), "sequence_entropy": (-lp).sum(1).mean()}
    out["masked"] = {"entropy": masked_mean(entropy, mask), "kl": masked_mean(logprobs - ref_logprobs, mask),
                     "ratio": masked_mean((logprobs - old_logprobs).exp(), mask),
                     "sequence_entropy": (-logprobs * mask).sum(1).mean()}
    return {mode: {k: float(v) for k, v in values.items()} for mode, values in out.items()}


@torch.no_grad()
def pad_invariance(policy, reference, tokenizer, prompts: list[str], extra_pads: list[int], seed: int = 0) -> list[dict]:
    """Sample once, then score the same responses with 0, w₁, w₂, … extra pad columns; one row of
    ``logged_metrics`` per width (``{"extra_pads", "pad_fraction", "unmasked", "sentinel", "masked"}``)."""
    rollout = rollout_for(policy, tokenizer, prompts, seed=seed)
    rows = []
    for extra in extra_pads:
        ids, mask, old = widen(rollout, extra, tokenizer.pad_token_id)
        logp, entropy = response_logprobs(policy, rollout.prompt_ids, rollout.prompt_mask, ids, mask, with_entropy=True)
        ref = response_logprobs(reference, rollout.prompt_ids, rollout.prompt_mask, ids, mask)
        rows.append({"extra_pads": extra, "pad_fraction": float(1 - mask.float().mean()),
                     **logged_metrics(logp.float(), ref.float(), old, entropy.float(), mask)})
    return rows


def drift(rows: list[dict], mode: str, key: str) -> float:
    """max over widths of |metric(width) − metric(first width)|: 0 for a pad-invariant statistic."""
    return max(abs(r[mode][key] - rows[0][mode][key]) for r in rows)


def verdict(rows: list[dict], tolerance: float = 1e-4) -> tuple[bool, bool]:
    """(reproduced, fixed): some unmasked or sentinel statistic moves with the pad count by more than
    100 × ``tolerance``; every masked statistic stays within ``tolerance``."""
    keys = ("entropy", "kl", "ratio", "sequence_entropy")
    reproduced = any(drift(rows, mode, k) > 100 * tolerance for mode in ("unmasked", "sentinel") for k in keys)
    return reproduced, all(drift(rows, "masked", k) < tolerance for k in keys)


# ---- plots (take an ax) ------------------------------------------------------------------------
def plot_metric(ax, rows: list[dict], key: str, ylabel: str) -> None:
    from workbench.viz import plots

    x = [r["extra_pads"] for r in rows]
    styles = {"unmasked": (plots.BUG_COLOR, "mean over the grid (bug)"),
              "sentinel": (plots.SERIES_COLORS[4], f"pads set to {INVALID_LOGPROB} (bug)"),
              "masked": (plots.FIX_COLOR, "masked (fix)")}
    for mode, (color, label) in styles.items():
        ax.plot(x, [r[mode][key] for r in rows], "o-", color=color, label=label, ms=4)
    ax.set_xlabel("extra pad columns in the batch")
    ax.set_ylabel(ylabel)
    ax.legend()
    note_coinciding(ax)
