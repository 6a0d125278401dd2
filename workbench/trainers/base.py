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

import contextlib
import copy
import dataclasses
import json
import math
import numbers
import random
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from tqdm.auto import tqdm

from workbench.core.attention_backward import unverified_backward_reason
from workbench.core.errors import AttentionBackwardError, ConfigError, InputError, NonFiniteError, ResumeError, RunFolderInUse
from workbench.modeling.dropout import disable_dropout
from workbench.modeling.models import count_parameters
from workbench.trainers.checkpointing import latest_valid_checkpoint, load_checkpoint, run_folder_lock, save_checkpoint


@dataclass
class TrainerConfig:
    """Fields every trainer shares."""

    # ---- Run -------------------------------------------------------------------------------
    steps: int = 20
    """Number of optimisation steps (one rollout/batch each)."""
    # ---- Optimisation ----------------------------------------------------------------------
    learning_rate: float | str = "auto"
    """AdamW learning rate, or ``auto``: by the policy's parameter count — the value tuned for the
    shipped tiny models below 10M parameters, 1e-5 up to 1B and 1e-6 above (× the trainer's scale,
    e.g. ½ for DPO); printed when resolved. The tiny-model values would wreck a real checkpoint."""
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
    # ---- Precision and device ------------------------------------------------------------
    precision: str = "fp32"
    """``fp32``; ``bf16-mixed`` — forwards under bf16 autocast, fp32 master weights and optimiser
    state (the AMP convention); ``bf16`` — weights and optimiser in pure bf16, a documented hazard:
    an update smaller than ~2⁻⁹ of a weight rounds away (pitfall P23)."""
    train_with_unverified_attention: bool = False
    """Train a policy whose attention back-end's gradients were measured wrong or not verified at its head dim,
    release and GPU (``core.attention_backward``: ``flash_attention_4`` outside head dims 24, 32, 64, 96,
    128, 192, 256 of 4.0.0b36 on an H100). False refuses with the measurement; True trains anyway — for a
    configuration you have checked with ``scripts/gpu_check.py --sections kernels,gradients --kernel-map``."""

    # learning_rate="auto": (the value tuned for the shipped tiny models, the trainer's scale for larger ones)
    AUTO_LEARNING_RATE: ClassVar[tuple[float, float]] = (1e-3, 1.0)

    def __post_init__(self):
        require_field_types(self)
        self.validate()

    def validate(self) -> None:
        """Raise ``ConfigError`` for values that cannot work."""
        require(self, "steps", self.steps >= 0, "must be ≥ 0")
        require(self, "learning_rate", self.learning_rate == "auto" or (isinstance(self.learning_rate, (int, float))
                                                                         and self.learning_rate > 0), "must be 'auto' or > 0")
        require_choice(self, "precision", PRECISIONS)
        require(self, "max_grad_norm", self.max_grad_norm >= 0, "must be ≥ 0 (0 disables clipping)")
        require(self, "checkpoint_every", self.checkpoint_every >= 0, "must be ≥ 0")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def resolve_learning_rate(self, model) -> float:
        """``learning_rate``, with ``auto`` resolved by ``model``'s parameter count."""
        if self.learning_rate != "auto":
            return float(self.learning_rate)
        parameters = count_parameters(model)
        tiny_value, scale = self.AUTO_LEARNING_RATE
        if parameters < TINY_MODEL_PARAMETERS:
            return tiny_value
        resolved = (1e-5 if parameters < 1e9 else 1e-6) * scale
        print(f"{type(self).__name__}.learning_rate=auto → {resolved:.0e} for a {parameters / 1e6:.0f}M-parameter model")
        return resolved


PRECISIONS = ("fp32", "bf16-mixed", "bf16")
TINY_MODEL_PARAMETERS = 10e6  # below this, learning_rate="auto" is the value tuned for the shipped tiny models


def apply_precision(models, precision: str) -> None:
    """Pure bf16 (``precision="bf16"``) converts the weights; the other modes keep fp32 weights."""
    if precision == "bf16":
        print("precision=bf16: weights and optimiser state in bf16; updates below ~2⁻⁹ of a weight are lost (pitfall P23). "
              "precision='bf16-mixed' keeps fp32 master weights.")
        for model in models:
            if model is not None:
                model.to(torch.bfloat16)


def precision_context(precision: str, device: torch.device):
    """bf16 autocast for ``bf16-mixed`` (matmuls in bf16, weights and reductions in fp32), else nothing."""
    if precision == "bf16-mixed":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def require(config, field: str, condition: bool, problem: str) -> None:
    """Raise a ``ConfigError`` naming ``field``, its value and the problem unless ``condition``."""
    if not condition:
        raise ConfigError(f"{type(config).__name__}.{field}={getattr(config, field)!r} {problem}", field=field)


def require_field_types(config) -> None:
    """A ``ConfigError`` for a field declared ``int``, ``float`` or ``bool`` holding another type (``steps="3"`` from
    Python; the command line converts its strings first), which the value checks below would otherwise meet as a bare
    ``TypeError`` ("'>=' not supported between 'str' and 'int'") or let through. An int is a float; a bool is neither."""
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        kind, value = hints.get(field.name), getattr(config, field.name)
        truth = type(value).__name__ in ("bool", "bool_")  # Python's or numpy's
        if kind is bool:
            require(config, field.name, truth, "must be True or False")
        elif kind is int:  # numbers.Integral: numpy's integers too
            require(config, field.name, isinstance(value, numbers.Integral) and not truth, "must be an int")
        elif kind is float:
            require(config, field.name, isinstance(value, numbers.Real) and not truth, "must be a number")


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


def optimizer_step(loss: torch.Tensor, optimizers, parameter_groups, max_grad_norm: float, names=("loss",)) -> float:
    """One guarded update: refuse a non-finite loss (nothing applied), back-propagate, clip each
    parameter group's gradients (refusing non-finite ones), step every optimizer. ``loss`` may be a
    tuple of losses (summed for the backward, each checked by its name). Returns the first group's
    pre-clip gradient norm."""
    parts = loss if isinstance(loss, tuple) else (loss,)
    for part, name in zip(parts, names, strict=True):
        check_finite_loss(part, name)
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)
    sum(parts).backward()
    norms = [clip_and_check_gradients(parameters, max_grad_norm) for parameters in parameter_groups]
    for optimizer in optimizers:
        optimizer.step()
    return norms[0]


def frozen_reference(policy, reference=None):
    """The reference model: ``reference`` if given, else a deep copy of the *live* initial policy
    (never reloaded from disk, as TRL does from ``config._name_or_path``), frozen: eval mode, no grad."""
    reference = reference if reference is not None else copy.deepcopy(policy)
    return reference.eval().requires_grad_(False)


PROMPT_ROWS_FIX = ("pass workbench.tasks.Problem rows (prompt, answer): workbench.tasks.rl_problems(n), or "
                   "Problem(prompt, answer) for your own")


def require_data(rows, trainer: str, what: str, *, attributes: tuple[str, ...] = (), keys: tuple[str, ...] = (),
                  fix: str = "") -> None:
    """A ``ValueError`` for an empty dataset, or for the first row without one of ``attributes`` (a ``Problem``'s
    ``prompt``, ``answer``) or ``keys`` (a preference dict's), naming the row, what it is, and ``fix``."""
    if not rows:
        raise ValueError(f"{trainer} got an empty {what} dataset; pass at least one row")
    for index, row in enumerate(rows):
        lacking = [a for a in attributes if not hasattr(row, a)] + [k for k in keys if not (isinstance(row, dict) and k in row)]
        if lacking:
            shown = repr(row)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise ValueError(f"{trainer}: {what} row {index} is a {type(row).__name__} ({shown}) without "
                             f"{', '.join(lacking)}; {fix}")


def check_attention_backward(config: TrainerConfig, policy, role: str = "policy") -> None:
    """Refuse (``AttentionBackwardError``) to train ``policy`` (or a critic) through an attention back-end whose gradients
    were measured wrong or not verified at its head dim, release and GPU (``core.attention_backward``), unless
    ``config.train_with_unverified_attention``. Checked once, when the trainer is built, from
    the model's config: a back-end switched afterwards (``set_attn_implementation``) is not seen here — a
    ``workbench.watch`` on the run flags its training forwards (S2)."""
    reason = unverified_backward_reason(policy)
    if reason is None or config.train_with_unverified_attention:
        return
    raise AttentionBackwardError(
        f"{type(config).__name__}: the {role} runs {reason}. Training would apply its gradients without an error. "
        f"Load the {role} with attn_implementation='sdpa' (or 'auto') to train; scoring and sampling under it are "
        "unaffected. To train through it anyway (a configuration you have checked), set train_with_unverified_attention=True.")


def prepare_policy(config: TrainerConfig, policy, others=(), disable_dropout: bool = True):
    """The start every trainer shares: the attention back-end's backward check, the P7 dropout switch on the policy
    and the ``others`` (reference, critic), the precision mode, the resolved learning rate and the policy's AdamW.
    Returns ``(dropout_on, learning_rate, optimizer)``."""
    check_attention_backward(config, policy)
    models = (policy, *others)
    dropout_on = apply_dropout_switch(models, disable_dropout)
    apply_precision(models, config.precision)
    learning_rate = config.resolve_learning_rate(policy)
    return dropout_on, learning_rate, adamw(policy.parameters(), lr=learning_rate, weight_decay=getattr(config, "weight_decay", 0.0))


def check_finite_loss(loss: torch.Tensor, name: str = "loss") -> None:
    if not torch.isfinite(loss).all():
        raise NonFiniteError(
            f"{name} is {loss.detach().flatten()[:4].tolist()}; the step was not applied and the last good "
            "checkpoint is kept. Lower the learning rate or check the inputs for inf/NaN."
        )


class Trainer:
    """Base class: subclasses set ``self.config`` and implement ``train_step``."""

    config: TrainerConfig

    dist = None  # a workbench.trainers.distributed.Distributed where the trainer supports data parallelism

    @property
    def is_main_process(self) -> bool:
        """Only the main process writes checkpoints and histories."""
        return self.dist is None or self.dist.is_main_process

    def __init__(self) -> None:
        self.step = 0
        self.history: list[dict] = []

    # -- what a checkpoint holds (defaults: one policy, one optimizer) -------------------------
    def modules(self) -> dict[str, torch.nn.Module]:
        return {"policy": self.policy}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer}

    def generators(self) -> dict[str, torch.Generator]:
        return {}

    def optimizer_owners(self) -> dict[str, torch.nn.Module]:
        """Each optimiser's module (by name), needed to gather or scatter its state under FSDP2: by default the
        optimisers and modules in the order listed."""
        return dict(zip(self.optimizers(), self.modules().values(), strict=False))

    def train_step(self, step: int) -> dict:
        raise NotImplementedError

    # -- the loop -----------------------------------------------------------------------------
    @property
    def output_dir(self) -> Path | None:
        return Path(self.config.output_dir) if self.config.output_dir else None

    # Fields a resumed run may change: how long it runs and how it reports, not what it computes.
    RESUMABLE_CHANGES = ("steps", "progress", "resume", "output_dir", "checkpoint_every", "train_with_unverified_attention")

    def maybe_resume(self) -> bool:
        """Continue from the newest checkpoint that verifies, under the config it was saved with.

        Refuses (``ResumeError``) a folder saved under another config — that would mix two
        experiments in one history — and a folder none of whose checkpoints verifies. A corrupt
        newest checkpoint with a valid older one is skipped with a message."""
        if self.output_dir is None or not self.config.resume:
            return False
        folder, skipped = latest_valid_checkpoint(self.output_dir)
        for name, reason in skipped:
            print(f"warning: checkpoint {name} skipped: {reason}")
        if folder is None:
            if skipped:
                raise ResumeError(
                    f"no checkpoint in {self.output_dir} verifies ({len(skipped)} found, all damaged); nothing was trained. "
                    "Start a fresh run with another --output-dir, or delete its checkpoints/ folder to start over there."
                )
            return False
        if skipped:
            print(f"resuming from {folder.name}, the newest checkpoint that verifies")
        saved = json.loads((folder / "state.json").read_text()).get("config", {})
        current = self.config.to_dict()
        differing = {k: (saved[k], current.get(k)) for k in saved if k not in self.RESUMABLE_CHANGES and saved[k] != current.get(k)}
        if differing:
            listing = ", ".join(f"{k}: saved {a!r}, now {b!r}" for k, a, b in ((k, *v) for k, v in sorted(differing.items())))
            restore = " ".join(f"--set {k}={a}" for k, (a, _) in sorted(differing.items()))
            raise ResumeError(
                f"{self.output_dir} holds a run saved under another config ({listing}); resuming would mix two "
                f"experiments in one history. Either use a new --output-dir for the new config, or resume with the "
                f"saved values ({restore})."
            )
        modules, optimizers = self.modules(), self.optimizers()
        if self.dist is not None:  # FSDP2: the full tensors go into each process's shards
            modules, optimizers = self.dist.loaders(modules, optimizers, self.optimizer_owners())
        state = load_checkpoint(folder, modules=modules, optimizers=optimizers, generators=self.generators())
        self.step = state["step"]
        self.history = state["history"]
        random.setstate(_tuple_state(state["python_random"]))
        return True

    def save(self) -> Path | None:
        if self.output_dir is None:
            return None
        modules, optimizers = self.modules(), self.optimizers()
        if self.dist is not None:  # FSDP2: the shards gathered into full tensors (every process takes part)
            modules, optimizers = self.dist.full_state(modules, optimizers, self.optimizer_owners())
        if not self.is_main_process:
            return None
        return save_checkpoint(
            self.output_dir,
            self.step,
            modules=modules,
            optimizers=optimizers,
            generators=self.generators(),
            state={"history": self.history, "python_random": random.getstate(), "config": self.config.to_dict()},
        )

    @contextlib.contextmanager
    def hold_output_dir(self):
        """Hold ``output_dir`` (``checkpointing.run_folder_lock``) for the block: ``RunFolderInUse`` when another training
        writes there. The main process takes it; under data parallelism every process learns whether it did (one
        all-reduce), so all of them stop together instead of the others waiting in a collective. Nested holds in one
        thread are one (``train`` holds it inside the command line's hold, which also covers its report files)."""
        refused = None
        with contextlib.ExitStack() as stack:
            if self.output_dir is not None and self.is_main_process:
                try:
                    stack.enter_context(run_folder_lock(self.output_dir))
                except InputError as error:  # RunFolderInUse, or a folder that cannot be made
                    refused = error
            if self.output_dir is not None and self.dist is not None and self.dist.enabled:
                if self.dist.max(1.0 if refused is not None else 0.0) > 0:
                    if refused is None:
                        refused = RunFolderInUse(f"{self.output_dir}: the main process could not take this output folder "
                                                 "(another training writes there, or it cannot be made; the main "
                                                 "process's message says which); nothing was trained")
                    self.dist.close()  # every process is here: leave the group together (gloo aborts one left alone)
            if refused is not None:
                raise refused
            yield

    @property
    def compute_device(self) -> torch.device:
        """Where the trained modules live (the trainers follow the model's device)."""
        module = next(iter(self.modules().values()))
        return next(module.parameters()).device

    def train(self, steps: int | None = None, on_step: Callable[[dict], None] | None = None) -> list[dict]:
        """Run until ``steps`` (default ``config.steps``) steps are done; returns the history. ``on_step(record)`` is
        called after each step with its history record (a progress bar in another process, a live plot)."""
        total = self.config.steps if steps is None else steps
        # the output folder is this run's while it trains: another training into it is refused (RunFolderInUse)
        with self.hold_output_dir():
            self.maybe_resume()
            bar = tqdm(total=total, initial=self.step, disable=not self.config.progress, desc=type(self).__name__, leave=False)
            while self.step < total:
                start = time.perf_counter()
                with precision_context(self.config.precision, self.compute_device):
                    metrics = self.train_step(self.step)
                metrics = {"step": self.step, **metrics, "seconds": time.perf_counter() - start}
                self.history.append(metrics)
                self.step += 1
                bar.update(1)
                if on_step is not None:
                    on_step(metrics)
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
