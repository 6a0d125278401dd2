"""The loop every trainer shares: steps, history, NaN guard, atomic checkpoints, resume.

A trainer subclass provides ``train_step(step) -> dict`` and lists what a checkpoint must hold
(``modules``, ``optimizers``, ``generators``). ``Trainer.train`` then

* resumes from ``<output_dir>/checkpoints/latest`` when it exists (weights, optimizer, RNG and
  history restored, so a resumed run continues exactly where it stopped);
* stops with ``NonFiniteError`` when a loss or gradient is NaN/inf, *before* the optimizer step,
  leaving the last good checkpoint in place;
* writes a checkpoint every ``checkpoint_every`` steps and at the end.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from workbench.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from workbench.errors import (
    ConfigError,  # noqa: F401  (re-exported)
    NonFiniteError,  # noqa: F401  (re-exported)
)


@dataclass
class TrainerConfig:
    """Fields every trainer shares."""

    # ---- Run -------------------------------------------------------------------------------
    steps: int = 20
    """Number of optimisation steps (one rollout/batch each)."""
    # ---- Optimisation ----------------------------------------------------------------------
    learning_rate: float = 1e-3
    """Adam learning rate."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global L2 norm (0 disables clipping)."""
    # ---- Run -------------------------------------------------------------------------------
    seed: int = 0
    """Seed for weights-independent randomness: data order and sampling. Same seed, same numbers."""
    output_dir: str | None = None
    """Folder for checkpoints and history; None keeps the run in memory only."""
    checkpoint_every: int = 0
    """Write a checkpoint every this many steps (0: only at the end, if output_dir is set)."""
    resume: bool = True
    """Continue from ``output_dir``'s latest checkpoint when there is one."""
    progress: bool = True
    """Show a tqdm progress bar."""

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ``ConfigError`` for values that cannot work."""
        require(self, "steps", self.steps >= 0, "must be ≥ 0")
        require(self, "learning_rate", self.learning_rate > 0, "must be > 0")
        require(self, "max_grad_norm", self.max_grad_norm >= 0, "must be ≥ 0 (0 disables clipping)")
        require(self, "checkpoint_every", self.checkpoint_every >= 0, "must be ≥ 0")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def require(config, field: str, condition: bool, problem: str) -> None:
    """Raise a ``ConfigError`` naming ``field``, its value and the problem unless ``condition``."""
    if not condition:
        raise ConfigError(f"{type(config).__name__}.{field}={getattr(config, field)!r} {problem}")


def require_choice(config, field: str, choices) -> None:
    require(config, field, getattr(config, field) in choices, f"is not one of {tuple(choices)}")


def step_generator(seed: int, step: int) -> torch.Generator:
    """A generator seeded from (seed, step): a step's sampling does not depend on earlier steps."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def apply_dropout_switch(models, disable: bool) -> bool:
    """Pitfall P7 in one place: with ``disable`` (the fix) every dropout probability of ``models``
    is set to 0; otherwise dropout stays on and the models stay in train mode, as in a loop that
    never calls ``eval()``. One mode for the whole run: switching it every step would walk all
    modules for nothing. Returns whether dropout is on. ``None`` entries are skipped."""
    from workbench.models import disable_dropout

    for model in models:
        if model is None:
            continue
        if disable:
            disable_dropout(model)
        model.train(not disable)
    return not disable


def sampling_generator(generator: torch.Generator, device: torch.device, seed: int, step: int) -> torch.Generator:
    """The generator for sampling on ``device``: the step's CPU generator itself on a CPU, a
    device generator seeded from (seed, step) on a GPU (a CPU generator cannot drive CUDA sampling)."""
    if device.type == "cpu":
        return generator
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + step)


def adamw(parameters, lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW with the fused kernel (one call per step instead of a Python loop over tensors;
    measurably faster for the many small tensors of a tiny model). Falls back where unsupported."""
    parameters = list(parameters)
    try:
        return torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)


def clip_and_check_gradients(parameters, max_grad_norm: float) -> float:
    """Clip gradients (if ``max_grad_norm`` > 0) and return the pre-clip norm; raise on NaN/inf."""
    parameters = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm if max_grad_norm > 0 else float("inf"))
    if not torch.isfinite(norm):
        raise NonFiniteError(
            f"gradient norm is {float(norm)}; the step was not applied and the last good checkpoint is kept. "
            "Lower the learning rate or check the inputs for inf/NaN."
        )
    return float(norm)


def check_finite_loss(loss: torch.Tensor, name: str = "loss") -> None:
    if not torch.isfinite(loss).all():
        raise NonFiniteError(
            f"{name} is {loss.detach().flatten()[:4].tolist()}; the step was not applied and the last good "
            "checkpoint is kept. Lower the learning rate or check the inputs for inf/NaN."
        )


class Trainer:
    """Base class: subclasses set ``self.config`` and implement ``train_step``."""

    config: TrainerConfig

    dist = None  # a workbench.distributed.Distributed where the trainer supports data parallelism

    @property
    def is_main_process(self) -> bool:
        """Only the main process writes checkpoints and histories."""
        return self.dist is None or self.dist.is_main_process

    def __init__(self) -> None:
        self.step = 0
        self.history: list[dict] = []

    # -- what a checkpoint holds ------------------------------------------------------------
    def modules(self) -> dict[str, torch.nn.Module]:
        raise NotImplementedError

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        raise NotImplementedError

    def generators(self) -> dict[str, torch.Generator]:
        return {}

    def train_step(self, step: int) -> dict:
        raise NotImplementedError

    # -- the loop -----------------------------------------------------------------------------
    @property
    def output_dir(self) -> Path | None:
        return Path(self.config.output_dir) if self.config.output_dir else None

    def maybe_resume(self) -> bool:
        if self.output_dir is None or not self.config.resume:
            return False
        folder = latest_checkpoint(self.output_dir)
        if folder is None:
            return False
        state = load_checkpoint(folder, modules=self.modules(), optimizers=self.optimizers(), generators=self.generators())
        self.step = state["step"]
        self.history = state["history"]
        random.setstate(_tuple_state(state["python_random"]))
        return True

    def save(self) -> Path | None:
        if self.output_dir is None or not self.is_main_process:
            return None
        return save_checkpoint(
            self.output_dir,
            self.step,
            modules=self.modules(),
            optimizers=self.optimizers(),
            generators=self.generators(),
            state={"history": self.history, "python_random": random.getstate(), "config": self.config.to_dict()},
        )

    def train(self, steps: int | None = None) -> list[dict]:
        """Run until ``steps`` (default ``config.steps``) steps are done; returns the history."""
        total = self.config.steps if steps is None else steps
        self.maybe_resume()
        bar = tqdm(total=total, initial=self.step, disable=not self.config.progress, desc=type(self).__name__, leave=False)
        while self.step < total:
            start = time.perf_counter()
            metrics = self.train_step(self.step)
            metrics = {"step": self.step, **metrics, "seconds": time.perf_counter() - start}
            self.history.append(metrics)
            self.step += 1
            bar.update(1)
            bar.set_postfix({k: f"{v:.3g}" for k, v in metrics.items() if k in self.progress_keys and _is_number(v)})
            every = self.config.checkpoint_every
            if every and self.step % every == 0 and self.step < total:
                self.save()
        bar.close()
        self.save()
        return self.history

    progress_keys: tuple[str, ...] = ("loss", "reward")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _tuple_state(state):
    """JSON turns Python's random state tuples into lists; turn them back."""
    return tuple(_tuple_state(s) if isinstance(s, list) else s for s in state)
