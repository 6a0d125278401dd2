"""Trainers: PPO, GRPO, DPO (and the SFT used to make the shipped checkpoint).

Each trainer module reads top to bottom: its config dataclass (a docstring under every field),
then one ``train_step``. The shared loop — progress bar, history, NaN guard, atomic
checkpoints and resume — lives in ``base.py``.
"""
