"""Supervised fine-tuning on a task (``tasks.registry``): how the shipped ``tiny-arith-*``, ``tiny-sums-qwen2`` and
``tiny-restate-qwen2`` checkpoints are made (``scripts/train_tiny_checkpoint.py``).

Each example is ``<bos> prompt answer <eos>``, right-padded; the loss is the token mean of the
negative log-likelihood over answer tokens and EOS only (prompt tokens are masked). Training is
deliberately short, so the RL notebooks start from a policy that is right only part of the time.
The same trainer also takes pre-tokenised ``(ids, loss_mask)`` rows (e.g. chat-formatted conversations:
``trainers/realistic_chat.py``), right-padded the same way.

Under ``accelerate launch`` (DDP or FSDP2, ``trainers/distributed.py``) every process draws the same batch and trains on
its contiguous share of the rows; the token count that normalises the loss is summed over the processes first, so the
loss and the update are those of one process with the whole batch (``batch_size`` must divide by the processes).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import ClassVar

import torch

from workbench.core import losses
from workbench.core.batching import pad_sequences
from workbench.modeling.scoring import forward, logprobs_from_logits
from workbench.tasks import Problem, encode_response
from workbench.trainers.base import Trainer, TrainerConfig, optimizer_step, prepare_policy, require
from workbench.trainers.distributed import Distributed


@dataclass
class SFTConfig(TrainerConfig):
    """SFTTrainer's hyper-parameters (supervised fine-tuning on the task) and the P8 switch."""

    AUTO_LEARNING_RATE: ClassVar[tuple[float, float]] = (1e-3, 2.0)  # tiny models; 2e-5 up to 1B parameters, 2e-6 above

    batch_size: int = 64
    """Examples per optimisation step."""
    warmup_steps: int = 50
    """Linear learning-rate warm-up, then cosine decay to 10% over ``steps``."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    pad_equals_eos: bool = False
    """P8 switch: pad with the EOS token and build the loss mask as ``ids != pad`` (bug: every EOS
    target is dropped) instead of a distinct pad token and an explicit response mask (fix)."""

    def validate(self) -> None:
        super().validate()
        require(self, "batch_size", self.batch_size >= 1, "must be ≥ 1")


def sft_batch(tokenizer, problems: list[Problem], pad_equals_eos: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids, attention_mask, loss_mask)``, right-padded; loss_mask marks answer + EOS targets.

    ``pad_equals_eos`` reproduces P8: pads are EOS tokens and the loss mask is inferred as
    ``ids != pad``, which also removes the real EOS targets."""
    rows, loss_rows = [], []
    for problem in problems:
        prompt = tokenizer(problem.prompt)["input_ids"]
        response = encode_response(tokenizer, problem.answer)
        rows.append(prompt + response)
        loss_rows.append([0] * len(prompt) + [1] * len(response))
    pad = tokenizer.eos_token_id if pad_equals_eos else tokenizer.pad_token_id
    ids, attention_mask = pad_sequences(rows, pad, side="right")
    loss_mask, _ = pad_sequences(loss_rows, 0, side="right")
    if pad_equals_eos:
        loss_mask = loss_mask * (ids != pad).long()
    return ids, attention_mask, loss_mask


def rows_batch(rows: list[tuple[list[int], list[int]]], pad_token_id: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids, attention_mask, loss_mask)`` of pre-tokenised ``(ids, loss_mask)`` rows, right-padded (a
    tokenizer without a pad token pads with id 0: padded positions are masked out of attention and loss)."""
    ids, attention_mask = pad_sequences([r[0] for r in rows], 0 if pad_token_id is None else pad_token_id, side="right")
    loss_mask, _ = pad_sequences([r[1] for r in rows], 0, side="right")
    return ids, attention_mask, loss_mask


class SFTTrainer(Trainer):
    """Supervised fine-tuning on ``problems``: task ``Problem``s, or pre-tokenised ``(ids, loss_mask)`` rows."""

    def __init__(self, model, tokenizer, problems: list[Problem] | list[tuple[list[int], list[int]]], config: SFTConfig):
        super().__init__()
        self.model, self.tokenizer, self.problems, self.config = model, tokenizer, problems, config
        _, self.base_learning_rate, self.optimizer = prepare_policy(config, model, disable_dropout=False)
        self.dist = Distributed.current()
        self.train_model, self.optimizer = self.dist.prepare(self.model, self.optimizer)  # the DDP wrapper trains
        self.rng = random.Random(config.seed)

    def modules(self):
        return {"model": self.model}

    def optimizers(self):
        return {"optimizer": self.optimizer}

    def learning_rate(self, step: int) -> float:
        c = self.config
        if step < c.warmup_steps:
            return self.base_learning_rate * (step + 1) / c.warmup_steps
        progress = (step - c.warmup_steps) / max(1, c.steps - c.warmup_steps)
        return self.base_learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))

    def train_step(self, step: int) -> dict:
        rng = random.Random(self.config.seed * 1_000_003 + step)
        batch = [self.problems[rng.randrange(len(self.problems))] for _ in range(self.config.batch_size)]
        batch = self.dist.shard(batch)  # this process's rows (all of them in one process)
        tensors = (rows_batch(batch, self.tokenizer.pad_token_id) if isinstance(batch[0], tuple)
                   else sft_batch(self.tokenizer, batch, self.config.pad_equals_eos))
        ids, attention_mask, loss_mask = (t.to(self.compute_device) for t in tensors)
        self.model.train()
        logits = forward(self.train_model, ids, attention_mask)
        token_logprobs = logprobs_from_logits(logits[:, :-1], ids[:, 1:])
        mask = loss_mask[:, 1:].float()
        # the global batch's token count over the processes (DDP averages their gradients): the one-process loss
        normalizer = float(self.dist.sum(float(mask.sum()))) / self.dist.world_size
        loss = -losses.masked_sum(token_logprobs, mask) / normalizer
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate(step)
        grad_norm = optimizer_step(loss, [self.optimizer], [self.model.parameters()], self.config.max_grad_norm)
        return {"loss": float(self.dist.sum(float(loss.detach()))) / self.dist.world_size, "grad_norm": grad_norm}
