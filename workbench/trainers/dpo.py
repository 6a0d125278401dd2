"""DPO (direct preference optimisation) for causal LMs, readable top to bottom.

A batch of B preference pairs ``(prompt, chosen, rejected)`` becomes one right-padded tensor of
2B rows — ``prompt+chosen`` on top of ``prompt+rejected`` — scored in **one** forward pass of the
policy and one of the frozen reference. A sequence's log-prob is the **sum** of its token
log-probs over the tokens the loss mask keeps; the loss is ``losses.dpo_loss``.

S4 switch ``prompt_mask`` (how the loss mask is built, exactly as OpenRLHF's
``_get_batch_logps`` did it):

* ``"both"`` (fix, OpenRLHF commit 6106fb22): the mask loop zips the 2B rows with
  ``prompt_lengths * 2``, so every row's prompt is masked;
* ``"chosen_only"`` (the seed's bug): the loop zips 2B rows with the B prompt lengths; ``zip``
  stops after B rows, so only the chosen prompts are masked and the rejected log-probs keep
  their prompt tokens;
* ``"none"``: prompts counted on both sides (they cancel in the margin at step 0).

The reference is a frozen copy of the initial policy object (``reference="copy"``) or log-probs
precomputed once from it (``reference="precomputed"``) — never reloaded from disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from workbench.core import losses
from workbench.modeling.scoring import POSITION_IDS_MODES, tree_capable
from workbench.trainers import base
from workbench.trainers.base import (
    Trainer,
    TrainerConfig,
    require,
    require_choice,
    step_generator,
)
from workbench.trainers.distributed import Distributed
from workbench.trainers.preferences import (
    PROMPT_MASK_MODES,
    build_loss_mask,
    collate_encoded,
    collate_preferences,
    encode_pairs,
    prompt_target_mask,
    summed_logprobs,
)


@dataclass
class DPOConfig(TrainerConfig):
    """DPOTrainer's hyper-parameters and pitfall switches (the defaults are the fixes)."""

    AUTO_LEARNING_RATE: ClassVar[tuple[float, float]] = (1e-4, 0.5)  # tiny models; 5e-6 up to 1B parameters, 5e-7 above

    batch_size: int = 16
    """Preference pairs per step (the forward holds 2 × batch_size rows)."""
    beta: float = 0.1
    """β: strength of the implicit KL to the reference."""
    loss_type: str = "sigmoid"
    """``sigmoid`` (DPO; cDPO with label_smoothing), ``robust`` (TRL 1.16), ``ipo`` (TRL 1.16:
    length-averaged log-ratios), ``ipo_sum`` (OpenRLHF: summed) or ``hinge``; formulas and sources
    in ``workbench.core.losses.dpo_loss``."""
    label_smoothing: float = 0.0
    """ε, the assumed probability that a preference label is flipped: cDPO inside ``sigmoid``
    (OpenRLHF's convention; TRL 1.16's ``sigmoid`` ignores it), the 1/(1−2ε) form in ``robust``;
    no other loss uses it."""
    prompt_mask: str = "both"
    """S4 switch: ``both`` (fix), ``chosen_only`` (the seed's zip bug) or ``none``."""
    reference: str = "copy"
    """``copy``: a frozen copy of the initial policy scores every batch; ``precomputed``: its
    log-probs are computed once for the whole dataset before training."""
    position_ids: str = "mask"
    """Position ids of the forward: ``mask`` (fix) or ``model`` (S1 bug; harmless here because
    DPO batches are right-padded)."""
    packed: bool = False
    """Score with padding-free packed batches (one row, restarting position ids, no mask, no
    cache) instead of padded ones: same numbers up to float noise, less wasted compute."""
    share_prompts: bool = True
    """Run each pair's prompt once for its chosen and rejected rows (one row per pair, the two
    responses after the prompt under a prefix-tree attention mask, ``scoring.prefix_tree``): same
    numbers up to float noise (~1e-7 in fp32), ~35% fewer tokens through policy and reference. Used
    with ``position_ids="mask"``, unpacked, dropout off and sdpa attention; otherwise the plain forward."""
    disable_dropout: bool = True
    """P7 switch: dropout probabilities of policy and reference set to 0 (fix, TRL's default), or
    left on with the policy in train mode (bug: step-0 margins are dropout noise instead of 0)."""

    def validate(self) -> None:
        super().validate()
        require(self, "label_smoothing", self.label_smoothing == 0 or self.loss_type in ("sigmoid", "robust"),
                "is only used by loss_type 'sigmoid' (cDPO) and 'robust'; set it to 0 for this loss_type")
        require(self, "batch_size", self.batch_size >= 1, "must be ≥ 1")
        require(self, "beta", self.beta > 0, "must be > 0")
        require_choice(self, "loss_type", losses.DPO_LOSS_TYPES)
        require(self, "label_smoothing", 0 <= self.label_smoothing < 0.5, "must be in [0, 0.5)")
        require_choice(self, "prompt_mask", PROMPT_MASK_MODES)
        require_choice(self, "reference", ("copy", "precomputed"))
        require_choice(self, "position_ids", POSITION_IDS_MODES)


class DPOTrainer(Trainer):
    progress_keys = ("loss", "rewards/accuracies")

    def __init__(self, policy, tokenizer, pairs: list[dict], config: DPOConfig, reference=None):
        base.require_data(pairs, "DPOTrainer", "preference", keys=("prompt", "chosen", "rejected"),  # before anything is built
                          fix='pass dicts {"prompt": ..., "chosen": ..., "rejected": ...}: workbench.tasks.make_preferences(rows, seed)')
        super().__init__()
        self.policy, self.tokenizer, self.pairs, self.config = policy, tokenizer, pairs, config
        self.reference = base.frozen_reference(policy, reference)
        self.dropout_on, self.learning_rate, self.optimizer = base.prepare_policy(config, policy, (self.reference,), config.disable_dropout)
        self.dist = Distributed.current()
        self.train_policy, self.optimizer = self.dist.prepare(self.policy, self.optimizer)
        self.policy_parameters = list(self.policy.parameters())  # the optimizer's: listed once, not walked every step
        self.device = self.policy_parameters[0].device
        self.reference.to(self.device)
        # policy and reference take the same path (step-0 margins exactly 0); not with dropout on (P7),
        # nor when the model that trains cannot take the prefix-tree forward (a DDP wrapper)
        self.share_prompts = config.share_prompts and not self.dropout_on and tree_capable(self.train_policy)
        self._encoded: dict[int, tuple] = {}  # pair index → token ids: each pair is tokenised once per run
        self.precomputed_reference: torch.Tensor | None = None
        if config.reference == "precomputed":
            self.precomputed_reference = self._precompute_reference()
            self.reference = None

    def _precompute_reference(self, chunk: int = 256) -> torch.Tensor:
        """Reference log-probs (N, 2): chosen, rejected for every pair, computed once."""
        out = []
        with torch.no_grad():
            for start in range(0, len(self.pairs), chunk):
                batch = collate_preferences(self.tokenizer, self.pairs[start : start + chunk]).to(self.device)
                mask = build_loss_mask(batch.attention_mask, batch.prompt_lengths, self.config.prompt_mask)
                logps, _ = summed_logprobs(self.reference, batch, mask, position_ids=self.config.position_ids,
                                           packed=self.config.packed, share_prompts=self.share_prompts)
                out.append(logps.view(2, -1).T)
        return torch.cat(out)

    def batch_indices(self, step: int) -> list[int]:
        generator = step_generator(self.config.seed, step)
        return torch.randint(len(self.pairs), (self.config.batch_size,), generator=generator).tolist()

    def train_step(self, step: int) -> dict:
        c = self.config
        indices = self.dist.shard(self.batch_indices(step))  # this process's pairs (all of them in one process)
        new = list(dict.fromkeys(i for i in indices if i not in self._encoded))  # first seen, each once
        self._encoded.update(zip(new, encode_pairs(self.tokenizer, [self.pairs[i] for i in new]), strict=True))
        batch = collate_encoded([self._encoded[i] for i in indices], self.tokenizer.pad_token_id).to(self.device)
        loss_mask = build_loss_mask(batch.attention_mask, batch.prompt_lengths, c.prompt_mask)
        b = batch.num_pairs
        with torch.no_grad():
            if self.precomputed_reference is not None:
                ref = self.precomputed_reference[indices].to(self.device)
                ref_chosen, ref_rejected = ref[:, 0], ref[:, 1]
            else:
                ref_logps, ref_tokens = summed_logprobs(self.reference, batch, loss_mask, position_ids=c.position_ids,
                                                        packed=c.packed, share_prompts=self.share_prompts)
                ref_chosen, ref_rejected = ref_logps[:b], ref_logps[b:]
        policy_logps, policy_tokens = summed_logprobs(self.train_policy, batch, loss_mask, position_ids=c.position_ids,
                                                      packed=c.packed, share_prompts=self.share_prompts)
        lengths = loss_mask.sum(-1)
        per_pair, chosen_rewards, rejected_rewards = losses.dpo_loss(
            policy_logps[:b], policy_logps[b:], ref_chosen, ref_rejected, c.beta, c.loss_type, c.label_smoothing,
            chosen_lengths=lengths[:b], rejected_lengths=lengths[b:],
        )
        loss = per_pair.mean()
        grad_norm = base.optimizer_step(loss, [self.optimizer], [self.policy_parameters], c.max_grad_norm)

        with torch.no_grad():
            prompt_targets = prompt_target_mask(batch.attention_mask, batch.prompt_lengths)
            prompt_logp = losses.masked_sum(policy_tokens.detach(), prompt_targets, dim=-1)
            counted_prompt_tokens = (loss_mask & prompt_targets).sum(-1)
        margins = chosen_rewards - rejected_rewards
        mean = self.dist.mean  # equal shards: the mean of the processes' means is the global mean
        return {
            "loss": mean(float(loss.detach())),
            "rewards/chosen": mean(float(chosen_rewards.mean())),
            "rewards/rejected": mean(float(rejected_rewards.mean())),
            "rewards/margins": mean(float(margins.mean())),
            "rewards/accuracies": mean(float((margins > 0).float().mean())),
            "logps/chosen": mean(float(policy_logps[:b].detach().mean())),
            "logps/rejected": mean(float(policy_logps[b:].detach().mean())),
            "logps/prompt": mean(float(prompt_logp[:b].mean())),
            "prompt_tokens_in_loss/chosen": int(self.dist.sum(int(counted_prompt_tokens[:b].sum()))),
            "prompt_tokens_in_loss/rejected": int(self.dist.sum(int(counted_prompt_tokens[b:].sum()))),
            "grad_norm": grad_norm,
        }
