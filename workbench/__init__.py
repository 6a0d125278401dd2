"""RLHF pitfalls workbench: trainers (PPO, GRPO, DPO, SFT), one module per pitfall notebook, the audit of
your own trainer, the peer lab and the papermill runner behind the notebooks in ``notebooks/``.

Start with ``python -m workbench list`` or ``notebooks/00_quickstart.ipynb``; the layers are described in
``docs/ARCHITECTURE.md`` (``core/`` tensor maths, ``modeling/`` models and sampling, ``tasks/``,
``trainers/``, ``experiments/``, ``viz/``, ``pitfalls/``, ``audit/``, ``peers/``, ``catalogue/``, ``cli/``).

The public surface — what the README and the notebooks use — is importable from here, loaded lazily
on first use (so ``import workbench.audit`` still loads only torch):

* ``load`` (``workbench.experiments.checkpoints``), ``tiny_model`` (``workbench.modeling.tiny``), ``save``
  (``workbench.modeling.models``) — models;
* ``PPOConfig``, ``PPOTrainer``, ``GRPOConfig``, ``GRPOTrainer``, ``DPOConfig``, ``DPOTrainer``,
  ``SFTConfig``, ``SFTTrainer`` — the trainers (``workbench.trainers.*``);
* ``audit`` — check your own trainer's functions (``workbench.audit``);
* ``watch`` — observe a real training run and report the pitfalls it shows (``workbench.watch``, callable);
* ``inspect`` — read a rollout dump brought home from a run elsewhere and report the pitfalls it shows
  (``workbench.inspect``, callable).

The library's own modules import each name from its home, never through this file.
"""

from importlib import import_module

__version__ = "0.1.0"

_PUBLIC = {
    "load": "workbench.experiments.checkpoints",
    "tiny_model": "workbench.modeling.tiny",
    "save": "workbench.modeling.models",
    "PPOConfig": "workbench.trainers.ppo",
    "PPOTrainer": "workbench.trainers.ppo",
    "GRPOConfig": "workbench.trainers.grpo",
    "GRPOTrainer": "workbench.trainers.grpo",
    "DPOConfig": "workbench.trainers.dpo",
    "DPOTrainer": "workbench.trainers.dpo",
    "SFTConfig": "workbench.trainers.sft",
    "SFTTrainer": "workbench.trainers.sft",
}
_SUBMODULES = ("audit", "watch", "inspect")

__all__ = sorted(_PUBLIC) + list(_SUBMODULES)


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(import_module(_PUBLIC[name]), name)
    elif name in _SUBMODULES:
        value = import_module(f"workbench.{name}")
    else:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
