"""Actor-critic PPO for causal language models, readable top to bottom.

One step, as in OpenRLHF / verl / "The N implementation details of RLHF with PPO":

1. **Rollout** — sample ``prompts_per_step`` prompts, sample a response for each from the policy
   at ``temperature`` (``workbench.modeling.rollout.sample``), truncate after the first EOS.
2. **Score** — the task reward on each response, minus ``missing_eos_penalty`` for responses
   that never produced EOS.
3. **Reward shaping** — per-token reward = −kl_coef · KL(π_old ‖ π_ref) (estimator ``kl_kind``),
   plus the score on the last response token; optional whitening over real tokens only.
4. **Advantages** — GAE(γ, λ) from a separate critic, optionally whitened over real tokens.
5. **Update** — ``ppo_epochs`` passes over shuffled mini-batches: clipped surrogate (ε low/high),
   clipped value loss, gradient clipping, one AdamW step each for actor and critic.

π_old is recomputed by default (``old_logprobs="recompute"``, as verl and OpenRLHF): the training
forward before any update, in the first epoch's mini-batch layout, so ρ = 1 exactly on the first
mini-batch; the sampler/trainer gap is a separate measured quantity (``first_ratio_deviation``).

Pitfall switches (``PPOConfig``; every default is the fix):

==========================  ==================  ===============================================
switch                      bug value           pitfall
==========================  ==================  ===============================================
``position_ids``            ``"model"``         S1 left padding without position ids: log-probs
                                                shift with the pad count (large for GPT-2, float
                                                noise for rotary models); with π_old from the
                                                sampler ρ ≠ 1 and KL ≠ 0 at step 0
``stop_at_eos``             ``False``           S3 every rollout decodes ``max_new_tokens`` steps;
                                                learning identical, compute wasted
``rescale_by_temperature``  ``False``           P6 scoring at τ = 1 what was sampled at τ
``disable_dropout``         ``False``           P7 dropout left on: ρ ≠ 1, KL ≠ 0 at step 0
``old_logprobs``            ``"rollout"``       P12 π_old from the sampler (with ``rollout_dtype``
                                                bf16: a bf16 engine feeding an fp32 trainer);
                                                ``tis_cap`` is the correction
``whiten_over``             ``"padded"``        P13 whitening statistics over padded positions
``reward_position``         ``"first_pad"``     P25 the score placed one token after the EOS (TRL
                                                #3750): masked out, the score never reaches the
                                                advantages (only full-length rows keep it)
==========================  ==================  ===============================================
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar

import torch

from workbench.core import losses
from workbench.core import rollout_correction as correction
from workbench.modeling.models import count_parameters
from workbench.modeling.rollout import Rollout
from workbench.tasks import Problem, score_responses
from workbench.trainers import base
from workbench.trainers.base import require, require_choice, step_generator
from workbench.trainers.critic import ValueModel
from workbench.trainers.rollout_trainer import RolloutConfig, RolloutTrainer


@dataclass
class PPOConfig(RolloutConfig):
    """PPOTrainer's hyper-parameters and pitfall switches (the defaults are the fixes)."""

    AUTO_LEARNING_RATE: ClassVar[tuple[float, float]] = (1e-4, 1.0)  # the actor's learning_rate="auto"

    # ---- Optimisation ----------------------------------------------------------------------
    critic_learning_rate: float | str = "auto"
    """Critic AdamW learning rate, or ``auto``: 1e-3 on the tiny models, 10× the actor's above 10M parameters."""
    # ---- Rollout ---------------------------------------------------------------------------
    prompts_per_step: int = 32
    """Prompts sampled per step (one response each): the rollout batch."""
    mini_batches: int = 2
    """Optimiser steps per PPO epoch: the rollout batch is split into this many shuffled mini-batches."""
    ppo_epochs: int = 2
    """Passes over the rollout batch per step."""
    # ---- Reward, advantages, value ---------------------------------------------------------
    kl_coef: float = 0.02
    """β of the per-token KL penalty in the reward."""
    kl_kind: str = "k1"
    """KL estimator in the reward: ``k1``, ``k2``, ``k3`` or ``low_var_kl`` (see ``losses.kl_penalty``)."""
    gamma: float = 1.0
    """GAE discount."""
    lam: float = 0.95
    """GAE λ."""
    value_clip: float = 0.2
    """Clip range of the value update around the old values."""
    whiten_rewards: bool = False
    """Rescale per-token rewards by their std over real tokens (mean kept)."""
    whiten_advantages: bool = True
    """Whiten advantages over real (unmasked) tokens."""
    tis_cap: float = 0.0
    """P12 correction: truncated importance sampling, per-token weight min(π_old/π_rollout, cap)
    (0 disables; needs ``old_logprobs="recompute"``)."""
    # ---- Pitfall switches (the default is the fix) -----------------------------------------
    old_logprobs: str = "recompute"
    """P12: π_old from ``recompute`` (fix; verl, OpenRLHF: the training forward before any update,
    in the first epoch's mini-batch layout, so ρ = 1 exactly on the first mini-batch) or from
    ``rollout`` (the sampler's own log-probs, as from an inference engine: the sampler/trainer gap
    then enters ρ and the KL — S1, P6, P12)."""
    rollout_dtype: str = "float32"
    """P12: dtype of the sampler's copy of the policy (``bfloat16`` mimics a bf16 inference engine
    feeding an fp32 trainer)."""
    whiten_over: str = "real"
    """P13: whiten advantages/rewards over real tokens only (fix) or over every padded position (bug)."""
    reward_position: str = "eos"
    """P25: the score goes on the last real response token, the EOS (fix), or on the position after it,
    the first pad (``first_pad``, TRL's PPO before #3750 / PR #5338; a full-length row keeps its last
    token). The pad is masked, so under the bug the score is dropped from the advantages."""

    def validate(self) -> None:
        super().validate()
        require(self, "ppo_epochs", self.ppo_epochs >= 1, "must be ≥ 1")
        require(self, "kl_coef", self.kl_coef >= 0, "must be ≥ 0 (a negative β rewards drifting away)")
        require_choice(self, "kl_kind", losses.KL_KINDS)
        require(self, "gamma", 0 <= self.gamma <= 1, "must be in [0, 1]")
        require(self, "lam", 0 <= self.lam <= 1, "must be in [0, 1]")
        require(self, "value_clip", self.value_clip > 0, "must be > 0")
        require(self, "critic_learning_rate", self.critic_learning_rate == "auto" or (
            isinstance(self.critic_learning_rate, (int, float)) and self.critic_learning_rate > 0), "must be 'auto' or > 0")
        require_choice(self, "old_logprobs", ("rollout", "recompute"))
        require_choice(self, "rollout_dtype", ("float32", "bfloat16", "float16"))
        require(self, "tis_cap", self.tis_cap == 0 or (self.tis_cap >= 1 and self.old_logprobs == "recompute"),
                "must be 0 (off) or ≥ 1 with old_logprobs='recompute' (TIS reweights rollout samples to π_old)")
        require_choice(self, "whiten_over", ("real", "padded"))
        require(self, "sampler_precision", self.sampler_precision == "fp32" or self.rollout_dtype == "float32",
                "and rollout_dtype both lower the sampler's precision: set one of them")
        require(self, "rollout_correction", self.rollout_correction is None or self.tis_cap == 0,
                "and tis_cap both reweight the tokens: set one of them (tis_cap c is {'rollout_is': 'token', "
                "'rollout_is_threshold': c})")
        spec = correction.resolve(self.rollout_correction)
        require(self, "rollout_correction", not (isinstance(spec, correction.TrlMode) and spec.off_policy_mask_threshold is not None),
                "sets off_policy_mask_threshold, which needs one advantage per sequence: GRPO only")
        require_choice(self, "reward_position", REWARD_POSITIONS)


REWARD_POSITIONS = ("eos", "first_pad")


def reward_index(mask: torch.Tensor, position: str = "eos") -> torch.Tensor:
    """(B,) index of the token that receives the score: the last real response token (``"eos"``), or
    the one after it when it exists (``"first_pad"``, P25: TRL's ``sequence_lengths + 1``)."""
    last = (mask.sum(-1).long() - 1).clamp_min(0)
    if position == "first_pad":
        return torch.where(last + 1 < mask.shape[-1], last + 1, last)
    return last


def last_token_rewards(scores: torch.Tensor, mask: torch.Tensor, position: str = "eos") -> torch.Tensor:
    """(B, R) zeros with each row's score on its last real response token (``position="first_pad"``:
    one token later, then zeroed by the mask — the P25 bug)."""
    rewards = torch.zeros_like(mask, dtype=torch.float32)
    last = reward_index(mask, position)
    rewards[torch.arange(mask.shape[0]), last] = scores.float()
    return losses.zero_masked(rewards, mask)


class PPOTrainer(RolloutTrainer):
    progress_keys = ("reward", "kl", "policy_loss")

    def __init__(self, policy, tokenizer, problems: list[Problem], config: PPOConfig, reference=None, critic=None):
        super().__init__()
        self.policy, self.tokenizer, self.problems, self.config = policy, tokenizer, problems, config
        base.require_data(problems, "PPOTrainer", "prompt", attributes=("prompt", "answer"), fix=base.PROMPT_ROWS_FIX)
        base.check_attention_backward(config, policy)
        self.reference = base.frozen_reference(policy, reference)
        self.critic = critic if critic is not None else ValueModel.from_policy(policy, seed=config.seed)
        base.check_attention_backward(config, getattr(self.critic, "body", self.critic), "critic")  # trained through its own attention
        self.dropout_on = base.apply_dropout_switch((self.policy, self.reference, self.critic), config.disable_dropout)
        self.rollout_model = None
        if config.rollout_dtype != "float32":  # P12: a lower-precision copy samples, the fp32 policy trains
            self.rollout_model = copy.deepcopy(policy).to(getattr(torch, config.rollout_dtype)).requires_grad_(False)
            self.rollout_model.train(self.dropout_on)
        self.device = next(policy.parameters()).device
        self.critic.to(self.device)
        base.apply_precision((self.policy, self.reference, self.critic), config.precision)
        self.learning_rate = config.resolve_learning_rate(policy)
        if config.critic_learning_rate == "auto":  # 1e-3 on the tiny models, 10× the actor's above
            tiny = count_parameters(policy) < base.TINY_MODEL_PARAMETERS
            self.critic_learning_rate = 1e-3 if tiny else 10 * self.learning_rate
        else:
            self.critic_learning_rate = float(config.critic_learning_rate)
        self.policy_optimizer = base.adamw(policy.parameters(), lr=self.learning_rate, weight_decay=0.0)
        self.critic_optimizer = base.adamw(self.critic.parameters(), lr=self.critic_learning_rate, weight_decay=0.0)

    def modules(self):
        return {"policy": self.policy, "critic": self.critic}

    def optimizers(self):
        return {"policy_optimizer": self.policy_optimizer, "critic_optimizer": self.critic_optimizer}

    # -- 1–2: rollout and score ------------------------------------------------------------------
    def rollout(self, step: int) -> tuple[list[Problem], Rollout, torch.Tensor]:
        sampler = None
        if self.rollout_model is not None:  # P12: the lower-precision copy samples
            self.rollout_model.load_state_dict(self.policy.state_dict())
            sampler = self.rollout_model
        else:
            sampler = self.rollout_sampler()
        problems, rollout = self.sample_rollout(step, sampler=sampler)
        scores = score_responses(self.tokenizer, problems, rollout.response_ids, rollout.response_mask, rollout.finished).to(self.device)
        return problems, rollout, scores

    def _values(self, rollout: Rollout, rows=slice(None)):
        return self.critic.response_values(
            rollout.prompt_ids[rows], rollout.prompt_mask[rows], rollout.response_ids[rows], rollout.response_mask[rows],
            position_ids=self.config.position_ids, packed=self.config.packed,
        )

    # -- one PPO step ----------------------------------------------------------------------------
    def train_step(self, step: int) -> dict:
        c = self.config
        problems, rollout, scores = self.rollout(step)
        mask = rollout.response_mask.float()
        penalised = scores - c.missing_eos_penalty * (~rollout.finished).float()

        # The training layout: PPO epochs over shuffled mini-batches, orders drawn up front.
        generator = step_generator(c.seed, step)
        orders = [torch.randperm(c.prompts_per_step, generator=generator).to(self.device) for _ in range(c.ppo_epochs)]
        size = c.prompts_per_step // c.mini_batches
        first_epoch = [orders[0][start : start + size] for start in range(0, c.prompts_per_step, size)]

        # 3. Reward shaping with a KL penalty to the frozen reference.
        whiten = losses.masked_whiten if c.whiten_over == "real" else (lambda x, m, **kw: losses.naive_whiten(x, **kw) * m)
        with torch.no_grad():
            # The training forward's view of the sampled tokens before any update. Against the
            # sampler's own log-probs it must give ρ = 1 up to float noise (S1, P6 and P12 break this).
            policy_logp = self.score_in_layout(self.policy, rollout, first_epoch)
            first_ratio_deviation = float(losses.zero_masked((policy_logp - rollout.rollout_logprobs).exp() - 1, mask).abs().max())
            first_logp_gap = float(losses.zero_masked(policy_logp - rollout.rollout_logprobs, mask).abs().max())
            old_logp = rollout.rollout_logprobs if c.old_logprobs == "rollout" else policy_logp
            ref_logp = self.score_in_layout(self.reference, rollout, first_epoch)
            old_values = losses.zero_masked(self._values(rollout), mask)
            kl = losses.zero_masked(losses.kl_penalty(old_logp, ref_logp, c.kl_kind), mask)
            rewards = -c.kl_coef * kl + last_token_rewards(penalised, mask, c.reward_position)
            if c.whiten_rewards:
                rewards = whiten(rewards, mask, shift_mean=False)
            # 4. Advantages.
            advantages, returns = losses.gae(rewards, old_values, mask, c.gamma, c.lam)
            if c.whiten_advantages:
                advantages = whiten(advantages, mask)
            weights = losses.tis_weights(old_logp, rollout.rollout_logprobs, c.tis_cap) if c.tis_cap else None
            # Rollout correction: π_old (the training forward before any update) against the sampler; its
            # weights and its mask act on the policy loss only (the critic and GAE keep every token).
            corrected = self.correct_rollout(policy_logp, rollout, mask) if c.watches_gap else None
            policy_mask = mask if corrected is None else corrected.mask.float()
            if corrected is not None and corrected.weights is not None:
                weights = corrected.weights

        # 5. PPO epochs over mini-batches.
        ratio_deviations: list[float] = []
        stats: dict[str, list[float]] = {k: [] for k in ("policy_loss", "value_loss", "clip_fraction", "approx_kl",
                                                          "value_clip_fraction", "entropy", "grad_norm")}
        for order in orders:
            for start in range(0, c.prompts_per_step, size):
                rows = order[start : start + size]
                mb_mask = mask[rows]
                logp, entropy = self.logprobs(self.policy, rollout, rows, with_entropy=True)
                with torch.no_grad():
                    ratio_deviations.append(float(losses.zero_masked((logp.detach() - old_logp[rows]).exp() - 1, mb_mask).abs().max()))
                policy_loss, policy_stats = losses.ppo_policy_loss(
                    logp, old_logp[rows], advantages[rows], policy_mask[rows], clip_low=c.clip_low, clip_high=c.clip_high,
                    loss_agg=c.loss_agg, weights=None if weights is None else weights[rows],
                )
                values = self._values(rollout, rows)
                value_loss, value_clip_fraction = losses.ppo_value_loss(values, old_values[rows], returns[rows], mb_mask, c.value_clip)
                grad_norm = base.optimizer_step(
                    (policy_loss, value_loss), [self.policy_optimizer, self.critic_optimizer],
                    [self.policy.parameters(), self.critic.parameters()], c.max_grad_norm, names=("policy loss", "value loss"))
                stats["policy_loss"].append(float(policy_loss.detach()))
                stats["value_loss"].append(float(value_loss.detach()))
                stats["clip_fraction"].append(policy_stats["clip_fraction"])
                stats["approx_kl"].append(policy_stats["approx_kl"])
                stats["value_clip_fraction"].append(value_clip_fraction)
                stats["entropy"].append(float(losses.masked_mean(entropy.detach(), mb_mask)))
                stats["grad_norm"].append(grad_norm)

        self.dump_step(step, rollout, rewards=penalised, loss_mask=policy_mask, trainer_logprobs=policy_logp, group_size=1)
        lengths = rollout.response_lengths.float()
        return {
            "reward": float(scores.mean()),
            "score_with_penalty": float(penalised.mean()),
            "kl": float(kl.sum(-1).mean()),
            "kl_token_max_abs": float(kl.abs().max()),
            # max |ρ − 1| between the sampler's log-probs and the training forward before any update
            # (S1/P6/P12 make it large), of the first optimiser step (ρ against π_old: 0 exactly with
            # old_logprobs="recompute") and the largest over the later steps (after updates)
            "first_ratio_deviation": first_ratio_deviation,
            # the same gap as max |log π_train − log μ_sampler| (nats): |ρ − 1| saturates at 1 as ρ → 0, this does not
            "first_logp_gap": first_logp_gap,
            "train_ratio_deviation": ratio_deviations[0],
            "ratio_deviation_later": max(ratio_deviations[1:]) if len(ratio_deviations) > 1 else float("nan"),
            "clip_fraction_first": stats["clip_fraction"][0],
            "advantage_mean_real_tokens": float(losses.masked_mean(advantages, mask)),
            **{k: sum(v) / len(v) for k, v in stats.items()},
            "response_length": float(lengths.mean()),
            "finished_fraction": float(rollout.finished.float().mean()),
            "tokens_generated": rollout.tokens_generated,
            "tokens_needed": rollout.tokens_needed,
            "decode_steps": rollout.decode_steps,
            "rollout_seconds": rollout.seconds,
            **({} if corrected is None else corrected.metrics),
            **self.engine_metrics(),
        }
