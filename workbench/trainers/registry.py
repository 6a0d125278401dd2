"""The trainer registry: a trainer's name → its (config class, trainer class).

One home for the names the command line (``python -m workbench train <name>``) and the multi-seed
comparisons (``experiments.comparison.train_variants(<name>, …)``) accept.
"""

from __future__ import annotations

from workbench.trainers.dpo import DPOConfig, DPOTrainer
from workbench.trainers.grpo import GRPOConfig, GRPOTrainer
from workbench.trainers.ppo import PPOConfig, PPOTrainer
from workbench.trainers.sft import SFTConfig, SFTTrainer

TRAINERS = {
    "ppo": (PPOConfig, PPOTrainer),
    "grpo": (GRPOConfig, GRPOTrainer),
    "dpo": (DPOConfig, DPOTrainer),
    "sft": (SFTConfig, SFTTrainer),
}


def trainer_classes(name: str):
    """``(Config, Trainer)`` of the trainer called ``name`` (one of ``TRAINERS``)."""
    if name not in TRAINERS:
        raise ValueError(f"trainer {name!r}: choose one of {sorted(TRAINERS)}")
    return TRAINERS[name]
