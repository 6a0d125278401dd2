"""GRPO (group relative policy optimisation) for causal LMs, readable top to bottom.

One step:

1. **Group sampling** — ``prompts_per_step`` prompts, ``num_generations`` completions each, sampled
   at ``temperature`` and stopped at EOS (post-EOS tokens masked, EOS kept).
2. **Group-relative advantages** — A_i = (R_i − mean_group R) / (std + ε) with ``scale_rewards``
   ``"group"``, ``"batch"`` or ``"none"`` (``losses.group_advantages``), one value per completion
   broadcast to its tokens.
3. **Loss** — per token: −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A) + β·k3(π‖π_ref), reduced by
   ``loss_agg`` (``losses.aggregate_loss``: verl names or TRL's ``grpo``/``bnpo``/``dapo``/``dr_grpo``).

π_old, as TRL and verl do it: when one generated batch feeds more than one optimiser step
(``mini_batches > 1`` or ``num_iterations > 1``), π_old is computed once per batch, before any
update, by the training forward in the training layout (the same rows per mini-batch), so ρ = 1
exactly on the first mini-batch and ρ ≠ 1 on the later ones, which clipping then acts on. The first
mini-batch's π_old is its own first training forward, detached (the same numbers a separate no-grad
forward gives, tested): one forward per batch fewer. When the
batch feeds exactly one step, π_old is π itself (``logp.detach()``): ρ ≡ 1 and the loss *value* is
−mean(A) — zero or not depending on the aggregation (pitfall S5) — while gradients are not zero.
The reference is scored in the same layout, so its KL to an identical policy is exactly 0.

Rollout correction (``rollout_correction``, ``sampler_precision``, ``rollout_staleness``): when the sampler
differs from the policy or a correction is asked for, π_old is scored for every row before the first update,
``core.rollout_correction`` compares it with the sampler's log-probs, its weights multiply the policy term
per token (as verl's and TRL's do), its mask replaces the loss mask, and a TRL setting's
``off_policy_mask_threshold`` drops, per optimiser step, the rows ``off_policy_mask`` rejects. The step's
history carries the ``rollout_corr/`` metrics (and a TRL setting's ``sampling/`` ones).

Pitfall switches (``GRPOConfig``; every default is the fix):

=============================  ===================  ==========================================
switch                         bug value            pitfall
=============================  ===================  ==========================================
``position_ids``               ``"model"``          S1 left padding without position ids
``stop_at_eos``                ``False``            S3 rollouts that do not stop at EOS
``loss_agg``                   ``"token-mean"``     S5 global token mean instead of the paper's
                                                    per-sequence mean (a convention: it is a
                                                    bug only where the paper's is intended)
``kl_aggregation``             ``"per_sequence"``   S5 policy and KL terms on two scales
``rescale_by_temperature``     ``False``            P6 scoring at τ = 1 what was sampled at τ
``disable_dropout``            ``False``            P7 dropout left on
``score_truncated_as_finished`` ``True``            P11 truncated responses scored as finished
=============================  ===================  ==========================================

``kl_aggregation="with_loss"`` (TRL today) adds the KL per token before the aggregation so both
terms share one normalisation; ``"per_sequence"`` reproduces the seed's mix: the policy term
aggregated by ``loss_agg`` but the KL term always as a per-sequence token mean, so the effective β
depends on the length distribution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from workbench.core import losses
from workbench.core import rollout_correction as correction
from workbench.tasks import Problem, score_responses
from workbench.trainers import base
from workbench.trainers.base import require, require_choice
from workbench.trainers.distributed import Distributed
from workbench.trainers.rollout_trainer import RolloutConfig, RolloutTrainer


@dataclass
class GRPOConfig(RolloutConfig):
    """GRPOTrainer's hyper-parameters and pitfall switches (the defaults are the fixes)."""

    # learning_rate="auto" on the tiny models (RL signal is weak next to Adam's noise: much higher degrades them)
    AUTO_LEARNING_RATE: ClassVar[tuple[float, float]] = (2e-4, 1.0)

    # ---- Rollout ---------------------------------------------------------------------------
    num_generations: int = 8
    """Completions sampled per prompt (the group size G ≥ 2)."""
    num_iterations: int = 1
    """Optimisation passes over each generated batch (μ in the GRPO paper)."""
    # ---- Policy objective ------------------------------------------------------------------
    loss_agg: str = "seq-mean-token-mean"
    """Loss aggregation: verl names or TRL aliases (``grpo``, ``bnpo``, ``dapo``, ``dr_grpo``); see
    ``losses.aggregate_loss`` for the formulas and how each treats a fully masked row."""
    scale_rewards: str = "group"
    """Advantage scaling: ``group``, ``batch`` or ``none`` (Dr. GRPO)."""
    beta: float = 0.0
    """Coefficient of the KL penalty to the reference (0: no reference model is used)."""
    kl_estimator: str = "k3"
    """Per-token KL estimator in the loss: ``k3`` (TRL, unclamped) or ``low_var_kl`` (verl: k3
    clamped to [−10, 10])."""
    mask_truncated_completions: bool = False
    """P11 option: leave completions that never produced EOS out of the loss (TRL's option)."""
    # ---- Pitfall switches (the default is the fix) -----------------------------------------
    kl_aggregation: str = "with_loss"
    """S5: ``with_loss`` adds β·KL per token before aggregating (fix); ``per_sequence`` normalises
    the KL per sequence whatever ``loss_agg`` is (the seed's inconsistent variant)."""
    score_truncated_as_finished: bool = False
    """P11: True scores a completion that never produced EOS by its text, as if it had finished
    (bug). Default: the task requires EOS, so a truncated completion scores 0."""

    def validate(self) -> None:
        super().validate()
        require(self, "num_generations", self.num_generations >= 2,
                "must be ≥ 2: group-relative advantages need at least two completions per prompt")
        require(self, "num_iterations", self.num_iterations >= 1, "must be ≥ 1")
        require(self, "beta", self.beta >= 0, "must be ≥ 0 (a negative β rewards drifting from the reference)")
        require_choice(self, "scale_rewards", losses.SCALE_REWARDS)
        require_choice(self, "kl_aggregation", ("with_loss", "per_sequence"))
        require_choice(self, "kl_estimator", ("k3", "low_var_kl"))

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.num_generations

    @property
    def optimizer_steps_per_batch(self) -> int:
        return self.num_iterations * self.mini_batches


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    loss_agg: str = "seq-mean-token-mean",
    kl_aggregation: str = "with_loss",
    kl_estimator: str = "k3",
    max_len: int | None = None,
    normalizer=None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """The GRPO objective for one batch of completions; ``advantages`` is per completion (B,).

    ``normalizer(mask, mode) -> float`` overrides each aggregation's denominator (data-parallel
    processes pass the global one, see ``workbench.trainers.distributed``). ``weights`` (detached, per
    token or per row) multiply the policy term, not the KL: rollout-correction weights."""
    per_token, was_clipped = losses.clipped_surrogate(logp, old_logp, advantages[:, None].expand_as(logp), clip_low, clip_high)
    if weights is not None:
        per_token = per_token * weights
    kl = losses.kl_penalty(logp, ref_logp, kl_estimator) if (beta > 0 and ref_logp is not None) else torch.zeros_like(logp)

    def aggregate(values, mode):
        return losses.aggregate_loss(values, mask, mode, max_len=max_len,
                                     normalizer=None if normalizer is None else normalizer(mask, mode))

    if kl_aggregation == "with_loss":
        loss = aggregate(per_token + beta * kl, loss_agg)
    else:
        loss = aggregate(per_token, loss_agg) + beta * aggregate(kl, "seq-mean-token-mean")
    with torch.no_grad():
        ratio_deviation = losses.zero_masked((logp.detach() - old_logp).exp() - 1, mask).abs()
    stats = {
        "clip_fraction": float(losses.masked_mean(was_clipped.float(), mask)),
        "kl": float(losses.masked_mean(kl.detach(), mask)),
        "ratio_deviation_max": float(ratio_deviation.max()) if ratio_deviation.numel() else 0.0,
    }
    return loss, stats


class GRPOTrainer(RolloutTrainer):
    progress_keys = ("reward", "loss")

    def __init__(self, policy, tokenizer, problems: list[Problem], config: GRPOConfig, reference=None):
        super().__init__()
        base.require_data(problems, "GRPOTrainer", "prompt", attributes=("prompt", "answer"), fix=base.PROMPT_ROWS_FIX)
        self.policy, self.tokenizer, self.problems, self.config = policy, tokenizer, problems, config
        self.reference = base.frozen_reference(policy, reference) if config.beta > 0 else None
        self.dropout_on, self.learning_rate, self.optimizer = base.prepare_policy(config, policy, (self.reference,), config.disable_dropout)
        # Under accelerate: sampling uses self.policy (identical everywhere), training forwards the
        # DDP-wrapped model on this process's shard of rows.
        self.dist = Distributed.current()
        self.train_policy, self.optimizer = self.dist.prepare(self.policy, self.optimizer)
        self.policy_parameters = list(self.policy.parameters())  # the optimizer's: listed once, not walked every step
        self.device = self.policy_parameters[0].device
        if self.reference is not None:
            self.reference.to(self.device)

    def _global_normalizer(self, mask, mode) -> float:
        """The global batch's denominator divided by the number of processes (DDP averages)."""
        return float(self.dist.sum(losses.aggregation_denominator(mask, mode, self.config.max_new_tokens))) / self.dist.world_size

    def training_layout(self) -> list[torch.Tensor]:
        """Which rows each optimiser step sees (whole groups, this process's shard of them), the same in every
        iteration: one row-index tensor per mini-batch."""
        c = self.config
        groups_per_mini_batch = c.prompts_per_step // c.mini_batches
        offsets = torch.arange(c.num_generations, device=self.device)
        layout = []
        for start in range(0, c.prompts_per_step, groups_per_mini_batch):
            groups = torch.arange(start, start + groups_per_mini_batch, device=self.device)
            layout.append(self.dist.shard((groups[:, None] * c.num_generations + offsets).reshape(-1)))
        return layout

    def train_step(self, step: int) -> dict:
        c = self.config
        # 1. Group sampling: each prompt repeated num_generations times, groups contiguous.
        problems, rollout = self.sample_rollout(step, repeats=c.num_generations, sampler=self.rollout_sampler())
        scored_as_finished = torch.ones_like(rollout.finished) if c.score_truncated_as_finished else rollout.finished
        rewards = score_responses(self.tokenizer, problems, rollout.response_ids, rollout.response_mask, scored_as_finished).to(self.device)
        rewards = rewards - c.missing_eos_penalty * (~rollout.finished).float()
        # 2. Group-relative advantages.
        advantages = losses.group_advantages(rewards, c.num_generations, c.scale_rewards)
        loss_mask = rollout.response_mask.float()
        if c.mask_truncated_completions:
            loss_mask = loss_mask * rollout.finished.float()[:, None]
        truncated_rewarded = int(((~rollout.finished) & (rewards > 0)).sum())
        # 3. Optimise, mini-batch by mini-batch in the training layout.
        layout = self.training_layout()
        ref_logp = self.score_in_layout(self.reference, rollout, layout) if self.reference is not None else None
        old_logp, first_is_own_old = None, False
        corrected, spec = None, correction.resolve(c.rollout_correction)
        if c.watches_gap:  # π_old of every row before any update, against the sampler's log-probs
            old_logp = self.score_in_layout(self.policy, rollout, layout)
            corrected = self.correct_rollout(old_logp, rollout, loss_mask)
            if corrected is not None:
                loss_mask = corrected.mask.float()
        elif c.optimizer_steps_per_batch > 1:
            # π_old before any update. The first mini-batch's is its own first training forward, detached:
            # the same forward on the same rows before any update, so no separate no-grad forward is run for
            # it (one forward saved per batch; tests/trainers/test_invariances.py checks that a separate one
            # gives exactly these numbers). One process only: under DDP the training forward is the wrapper's.
            first_is_own_old = not self.dist.enabled
            old_logp = self.score_in_layout(self.policy, rollout, layout[1:] if first_is_own_old else layout)
        dumped_logp = None
        records: dict[str, list[float]] = {k: [] for k in ("loss", "clip_fraction", "kl", "entropy", "grad_norm", "ratio_deviation_max")}
        for iteration in range(c.num_iterations):
            for index, rows in enumerate(layout):
                logp, entropy = self.logprobs(self.train_policy, rollout, rows, with_entropy=True)
                if first_is_own_old and iteration == 0 and index == 0:
                    old_logp[rows] = logp.detach()
                if old_logp is None and c.dump_rollouts is not None:  # one optimiser step: this forward is π_old
                    dumped_logp = torch.zeros_like(rollout.rollout_logprobs) if dumped_logp is None else dumped_logp
                    dumped_logp[rows] = logp.detach().float()
                weights = None if corrected is None or corrected.weights is None else corrected.weights[rows]
                if isinstance(spec, correction.TrlMode) and spec.off_policy_mask_threshold is not None:
                    kept = correction.off_policy_mask(advantages[rows], logp, rollout.rollout_logprobs[rows], loss_mask[rows],
                                                      spec.off_policy_mask_threshold)
                    weights = kept if weights is None else weights * kept
                loss, stats = grpo_loss(
                    logp, logp.detach() if old_logp is None else old_logp[rows], advantages[rows], loss_mask[rows],
                    ref_logp=None if ref_logp is None else ref_logp[rows], beta=c.beta, clip_low=c.clip_low,
                    clip_high=c.clip_high, loss_agg=c.loss_agg, kl_aggregation=c.kl_aggregation,
                    kl_estimator=c.kl_estimator, max_len=c.max_new_tokens,
                    normalizer=self._global_normalizer if self.dist.enabled else None, weights=weights,
                )
                records["grad_norm"].append(base.optimizer_step(loss, [self.optimizer], [self.policy_parameters], c.max_grad_norm))
                # per-process values → global ones (the loss: the sum of the processes' shares)
                records["loss"].append(float(self.dist.sum(float(loss.detach()))) / self.dist.world_size)
                records["clip_fraction"].append(self.dist.mean(stats["clip_fraction"]))
                records["kl"].append(self.dist.mean(stats["kl"]))
                records["ratio_deviation_max"].append(self.dist.max(stats["ratio_deviation_max"]))
                records["entropy"].append(self.dist.mean(float(losses.masked_mean(entropy.detach(), loss_mask[rows]))))

        self.dump_step(step, rollout, rewards=rewards, loss_mask=loss_mask, group_size=c.num_generations,
                       trainer_logprobs=old_logp if old_logp is not None else dumped_logp)
        lengths = rollout.response_lengths.float()
        correct = rewards > 0
        ratio_deviations = records.pop("ratio_deviation_max")
        return {
            "reward": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            **{k: sum(v) / len(v) for k, v in records.items()},
            # max |ρ − 1| of the first optimiser step of the batch (before any update: 0 exactly)
            # and the largest over the later ones (NaN when the batch feeds a single step)
            "ratio_deviation_first": ratio_deviations[0],
            "ratio_deviation_later": max(ratio_deviations[1:]) if len(ratio_deviations) > 1 else float("nan"),
            "clip_fraction_first": records["clip_fraction"][0],
            "kl_first": records["kl"][0],
            "response_length": float(lengths.mean()),
            "length_correct": float(lengths[correct].mean()) if correct.any() else float("nan"),
            "length_incorrect": float(lengths[~correct].mean()) if (~correct).any() else float("nan"),
            "finished_fraction": float(rollout.finished.float().mean()),
            "truncated_rewarded": truncated_rewarded,
            "tokens_generated": rollout.tokens_generated,
            "rollout_seconds": rollout.seconds,
            **({} if corrected is None else corrected.metrics),
            **self.engine_metrics(),
        }
