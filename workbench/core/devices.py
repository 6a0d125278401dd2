"""Where tensors live: the model's device wins, and callers get results back where their inputs were.

The library's entry points (``scoring.forward``, ``scoring.token_logprobs``/``response_logprobs``,
``rollout.sample``, ``critic.ValueModel.response_values``) accept inputs on any device. A notebook or a user's diagnostic builds its ids on
the CPU (tokenizers return CPU tensors) while the model may sit on a GPU; rather than make every
caller move its tensors, the entry points move the inputs to the model's device, compute there, and
hand per-token results back on the inputs' device, so the caller's CPU code keeps working. In the
trainers everything is already on the model's device and each move is a no-op.

A sampling generator must live on the device that samples: a CPU generator handed to a GPU model
seeds a device generator from one draw of its own stream (deterministic for a given seed, and the
CPU generator advances as if it had sampled).
"""

from __future__ import annotations

import torch

from workbench.core.errors import ModelLoadError


def model_device(model) -> torch.device:
    """The device of ``model``'s parameters (the CPU for a model without any)."""
    parameter = next(iter(model.parameters()), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def generator_on(generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """``generator`` itself when it lives on ``device``, else a ``device`` generator seeded from it."""
    if generator is None or generator.device.type == device.type:
        return generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    return torch.Generator(device=device).manual_seed(seed)


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"``: CUDA when available, else the CPU; anything else as given (a clear error for CUDA
    asked on a machine without it)."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    problem = device_problem(device)
    if problem:
        what, fix = problem
        raise ModelLoadError(f"device={str(device)!r} {what}; {fix}.")
    return torch.device(device)


def device_problem(device: str | torch.device) -> tuple[str, str] | None:
    """What is wrong with asking for ``device`` on this machine, and the fix (``None``: nothing): a name torch does not
    know, CUDA on a machine without it, a CUDA index beyond the GPUs present."""
    if str(device) == "auto":
        return None
    if isinstance(device, int) and not isinstance(device, bool):  # torch's shorthand for an accelerator index
        device = f"cuda:{device}"
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        return "is not a device name", "use 'auto', 'cpu', 'cuda' or 'cuda:N'"
    if device.type == "cuda" and not torch.cuda.is_available():
        return "was asked for but this machine has no CUDA GPU", "use device='auto' or 'cpu'"
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        return (f"was asked for but this machine has {torch.cuda.device_count()} CUDA GPU(s) (cuda:0 …)",
                "use device='cuda' or 'auto'")
    return None
