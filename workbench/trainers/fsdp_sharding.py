"""FSDP2 for the workbench's trainers: shard a model in place, and move its state to and from full tensors.

``Distributed`` (``distributed.py``) calls these under ``accelerate launch --use_fsdp --fsdp_version 2``. Sharding is
torch's ``fully_shard``: each decoder layer (the classes the model lists in ``_no_split_modules``), then the whole model;
its parameters become ``DTensor`` shards, so the optimiser is rebuilt over them. Checkpoints stay in the one format a
single process writes — full tensors, the optimiser's state keyed by parameter index — so a run saved under FSDP2
resumes in one process or under DDP, and the other way round: ``full_state`` gathers the shards (every process calls
it, the main process receives them), ``loaders`` scatter a full state back into the shards. Runs with gloo on a CPU
(torch 2.13); the reference model, a frozen copy made before sharding, stays whole in every process.
"""

from __future__ import annotations

import inspect

import torch


def _options(**kwargs):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def _layer_classes(model) -> set[str]:
    return set(getattr(model, "_no_split_modules", None) or ())


def shard(model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    """``model`` sharded in place with FSDP2 and a new optimiser like ``optimizer`` over its shards."""
    from torch.distributed.fsdp import fully_shard

    layers = _layer_classes(getattr(model, "body", model)) or _layer_classes(model)
    for module in list(model.modules()):
        if module is not model and type(module).__name__ in layers:
            fully_shard(module)
    fully_shard(model)
    accepted = set(inspect.signature(type(optimizer)).parameters) - {"fused", "foreach", "differentiable", "capturable"}
    settings = {k: v for k, v in optimizer.defaults.items() if k in accepted}  # the fused kernel takes no DTensor shards
    return model, type(optimizer)(model.parameters(), **settings)


class _Full:
    """A state dict standing in for a module or an optimiser in ``save_checkpoint`` (it calls ``state_dict()``)."""

    def __init__(self, state: dict):
        self._state = state

    def state_dict(self) -> dict:
        return self._state


def _names(model) -> list[str]:
    return [name for name, _ in model.named_parameters()]


def full_state(modules: dict, optimizers: dict, owners: dict) -> tuple[dict, dict]:
    """Every module's and optimiser's full state as ``_Full`` stand-ins (complete on rank 0, empty elsewhere).
    ``owners``: optimiser name → the module whose parameters it steps."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    full_modules = {name: _Full(get_model_state_dict(module, options=_options(cpu_offload=True)))
                    for name, module in modules.items()}
    full_optimizers = {}
    for name, optimizer in optimizers.items():
        model = owners[name]
        state = get_optimizer_state_dict(model, optimizer, options=_options(cpu_offload=True))
        index = {fqn: i for i, fqn in enumerate(_names(model))}
        by_index = {index[fqn]: value for fqn, value in state.get("state", {}).items()}
        groups = [{**group, "params": [index[fqn] for fqn in group["params"]]} for group in state.get("param_groups", [])]
        full_optimizers[name] = _Full({"state": by_index, "param_groups": groups})
    return full_modules, full_optimizers


class _ModelLoader:
    def __init__(self, model):
        self.model = model

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.model, state, options=_options(strict=strict))


class _OptimizerLoader:
    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def load_state_dict(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        names = _names(self.model)
        by_name = {"state": {names[int(i)]: value for i, value in state["state"].items()},
                   "param_groups": [{**group, "params": [names[int(i)] for i in group["params"]]}
                                    for group in state["param_groups"]]}
        set_optimizer_state_dict(self.model, self.optimizer, by_name, options=_options())


def loaders(modules: dict, optimizers: dict, owners: dict) -> tuple[dict, dict]:
    """Stand-ins for ``load_checkpoint``: their ``load_state_dict`` takes a full state (every process read the same
    files) and puts each process's shard of it into the sharded module or optimiser."""
    return ({name: _ModelLoader(module) for name, module in modules.items()},
            {name: _OptimizerLoader(owners[name], optimizer) for name, optimizer in optimizers.items()})
