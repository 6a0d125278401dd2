"""The training–inference gap of a dump, streamed: verl's ``rollout_corr/`` diagnostics per step and over the whole
dump, where in the response and on which token ids the gap sits, and whether it grows with training.

``GapSums`` holds the sufficient statistics of ``workbench.core.rollout_correction.mismatch_metrics`` — sums over
rows and over response tokens, a max and a min — so one pass over responses gives exactly the metrics that function
(and verl's ``compute_rollout_corr_metrics_from_logprobs``) computes on the padded batch of the same responses:
``metrics()`` on a step's responses equals ``mismatch_metrics`` on that step's tensors. Per token id the sums of
|log ρ| are gathered with ``np.bincount`` in chunks, so the memory is one array of the vocabulary's size.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from workbench.core.rollout_correction import PREFIX, SAFETY_BOUND

POSITION_BIN = 64  # response positions per bin of the position profile
POSITION_BINS = 32  # positions past the last bin count in it
FLUSH_TOKENS = 1 << 17  # token ids buffered before a bincount


class GapSums:
    """Sums over responses (rows) and their kept tokens, from which every ``rollout_corr/`` mismatch metric follows."""

    __slots__ = ("rows", "tokens", "exp_neg_train", "neg_train", "exp_neg_rollout", "neg_rollout", "diff", "abs_diff",
                 "diff_max", "diff_min", "exp_diff", "k1", "k3", "ratio_squared", "exp_two_seq", "abs_log_ratio")

    def __init__(self):
        self.rows = self.tokens = 0
        self.exp_neg_train = self.neg_train = self.exp_neg_rollout = self.neg_rollout = 0.0
        self.diff = self.abs_diff = self.exp_diff = self.k1 = self.k3 = self.ratio_squared = self.exp_two_seq = 0.0
        self.abs_log_ratio = 0.0
        self.diff_max, self.diff_min = -math.inf, math.inf

    def add(self, train: np.ndarray, rollout: np.ndarray) -> np.ndarray:
        """One response's kept tokens (both log-probs, float64); returns log ρ = train − rollout per token."""
        count = len(train)
        train_row = float(train.sum()) / max(count, 1)
        rollout_row = float(rollout.sum()) / max(count, 1)
        log_ratio = train - rollout
        self.rows += 1
        self.tokens += count
        self.exp_neg_train += math.exp(-train_row)
        self.neg_train -= train_row
        self.exp_neg_rollout += math.exp(-rollout_row)
        self.neg_rollout -= rollout_row
        diff = rollout_row - train_row
        self.diff += diff
        self.abs_diff += abs(diff)
        self.diff_max, self.diff_min = max(self.diff_max, diff), min(self.diff_min, diff)
        self.exp_diff += math.exp(diff)
        self.k1 -= float(log_ratio.sum())
        self.k3 += float((np.exp(log_ratio) - log_ratio - 1.0).sum())
        self.ratio_squared += float(np.exp(2.0 * np.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)).sum())
        self.exp_two_seq += math.exp(2.0 * min(max(float(log_ratio.sum()), -SAFETY_BOUND), SAFETY_BOUND))
        self.abs_log_ratio += float(np.abs(log_ratio).sum())
        return log_ratio

    def metrics(self) -> dict[str, float]:
        """verl's names, prefixed ``rollout_corr/``; empty when no response carried both log-probs."""
        if not self.rows:
            return {}
        rows, tokens = self.rows, max(self.tokens, 1)
        values = {"training_ppl": self.exp_neg_train / rows, "training_log_ppl": self.neg_train / rows,
                  "kl": self.k1 / tokens, "k3_kl": self.k3 / tokens,
                  "rollout_ppl": self.exp_neg_rollout / rows, "rollout_log_ppl": self.neg_rollout / rows,
                  "log_ppl_diff": self.diff / rows, "log_ppl_abs_diff": self.abs_diff / rows,
                  "log_ppl_diff_max": self.diff_max, "log_ppl_diff_min": self.diff_min, "ppl_ratio": self.exp_diff / rows,
                  "chi2_token": self.ratio_squared / tokens - 1.0, "chi2_seq": self.exp_two_seq / rows - 1.0}
        return {PREFIX + name: value for name, value in values.items()}


class GapProfile:
    """|log ρ| by response position (bins of ``POSITION_BIN``) and by token id, over the whole dump."""

    def __init__(self):
        self.position_sum = np.zeros(POSITION_BINS)
        self.position_count = np.zeros(POSITION_BINS, dtype=np.int64)
        self.token_sum = np.zeros(0)
        self.token_count = np.zeros(0, dtype=np.int64)
        self._ids: list[np.ndarray] = []
        self._gaps: list[np.ndarray] = []
        self._buffered = 0

    def add(self, positions: np.ndarray, token_ids: np.ndarray, abs_log_ratio: np.ndarray) -> None:
        bins = np.minimum(positions // POSITION_BIN, POSITION_BINS - 1)
        self.position_sum += np.bincount(bins, weights=abs_log_ratio, minlength=POSITION_BINS)
        self.position_count += np.bincount(bins, minlength=POSITION_BINS)
        self._ids.append(token_ids)
        self._gaps.append(abs_log_ratio)
        self._buffered += len(token_ids)
        if self._buffered >= FLUSH_TOKENS:
            self.flush()

    def flush(self) -> None:
        if not self._ids:
            return
        ids, gaps = np.concatenate(self._ids), np.concatenate(self._gaps)
        self._ids, self._gaps, self._buffered = [], [], 0
        ids = np.maximum(ids, 0)
        size = max(len(self.token_sum), int(ids.max(initial=-1)) + 1)
        sums, counts = np.bincount(ids, weights=gaps, minlength=size), np.bincount(ids, minlength=size)
        sums[: len(self.token_sum)] += self.token_sum
        counts[: len(self.token_count)] += self.token_count
        self.token_sum, self.token_count = sums, counts

    def top_tokens(self, count: int = 5, min_count: int = 3) -> list[dict]:
        """The token ids with the largest mean |log ρ| (seen at least ``min_count`` times), with their share of the
        dump's total |log ρ|."""
        self.flush()
        seen = np.flatnonzero(self.token_count >= min_count)
        if not len(seen):
            return []
        means = self.token_sum[seen] / self.token_count[seen]
        total = float(self.token_sum.sum()) or 1.0
        order = seen[np.argsort(-means, kind="stable")[:count]]
        return [{"token_id": int(token), "mean_abs_log_ratio": float(self.token_sum[token] / self.token_count[token]),
                 "count": int(self.token_count[token]), "share_of_gap": float(self.token_sum[token] / total)} for token in order]

    def by_position(self) -> list[dict]:
        """Mean |log ρ| per position bin that has tokens: ``{"from", "mean_abs_log_ratio", "tokens"}``."""
        return [{"from": int(i * POSITION_BIN), "mean_abs_log_ratio": float(self.position_sum[i] / self.position_count[i]),
                 "tokens": int(self.position_count[i])} for i in np.flatnonzero(self.position_count)]


def trend(steps: list[int], values: list[float]) -> dict:
    """How a per-step value moves with the step: Spearman's rank correlation and the ratio of the last third's mean to
    the first third's."""
    if len(steps) < 3:
        return {"steps": len(steps), "rank_correlation": 0.0, "growth": 1.0}
    step_ranks = np.argsort(np.argsort(steps)).astype(float)
    value_ranks = np.argsort(np.argsort(values, kind="stable"), kind="stable").astype(float)
    spread = float(step_ranks.std() * value_ranks.std())
    correlation = float(((step_ranks - step_ranks.mean()) * (value_ranks - value_ranks.mean())).mean() / spread) if spread else 0.0
    ordered = np.asarray(values)[np.argsort(steps)]
    third = max(len(ordered) // 3, 1)
    first, last = float(np.mean(ordered[:third])), float(np.mean(ordered[-third:]))
    return {"steps": len(steps), "rank_correlation": correlation, "growth": last / first if first > 0 else math.inf}


def padded_logprobs(rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Generic records (with ``trainer_logprobs`` and ``rollout_logprobs``) as right-padded float64 tensors (trainer,
    rollout, response mask), rows × longest response: what ``core.rollout_correction.mismatch_metrics`` takes. A
    ``loss_mask`` over prompt and response is cut to its response part; without one every response token counts."""
    width = max(len(row["response_ids"]) for row in rows)
    trainer, rollout, mask = (torch.zeros(len(rows), width, dtype=torch.float64) for _ in range(3))
    for i, row in enumerate(rows):
        n = len(row["response_ids"])
        trainer[i, :n] = torch.tensor(row["trainer_logprobs"], dtype=torch.float64)
        rollout[i, :n] = torch.tensor(row["rollout_logprobs"], dtype=torch.float64)
        mask[i, :n] = torch.tensor(row.get("loss_mask", [1] * n)[-n:], dtype=torch.float64)
    return trainer, rollout, mask

