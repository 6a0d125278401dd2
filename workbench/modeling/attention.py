"""Attention back-ends: which implementation a model runs (``sdpa``, ``eager``, ``flash_attention_2``,
``flash_attention_4``).

``"auto"`` picks flash-attention 2 where it can run (a CUDA GPU with the flash-attn package, a half-precision
model) and ``sdpa`` elsewhere; asking for a flash back-end where it cannot run is an error that says why,
rather than a silent fallback (right padding under flash-attention is pitfall S2).

flash-attn 4 runs only when asked for by name, and the trainers train through it only where its gradients were
measured right (``core.attention_backward``): on an H100 with flash-attn-4 4.0.0b36 its forward agreed with sdpa
to the printed digit, but its backward's dq was wrong at head dims 8, 16, 48 and 80 (dk/dv too under shared key/value
heads) and right at 24, 32, 64, 96, 128, 192 and 256 (docs/GPU.md). ``"auto"`` is resolved before the model's head
dim is known, so it never picks flash-attn 4. Scoring and generation under FA4 (no gradient) are unaffected.

The two flash packages share the import name ``flash_attn``: flash-attn 2 is the ``flash-attn``
distribution (CUDA extensions built from source), flash-attn 4 the ``flash-attn-4`` wheel (CuTe-DSL
kernels under ``flash_attn.cute``, compiled on first use; Hopper sm_90 and Blackwell sm_100+ only).
transformers (≥ 5) selects both by name; the workbench only checks that the one asked for is
installed and that the GPU can run it, by the distribution's name as transformers does.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util

import torch

from workbench.core.attention_backward import MEASURED_BACKWARD
from workbench.core.errors import AttentionBackendUnavailable

FLASH_BACKENDS = {
    # attn_implementation: (distribution name, lowest compute capability, how to install)
    "flash_attention_2": ("flash-attn", (8, 0), "pip install -e '.[gpu]' --no-build-isolation on a CUDA machine (builds from source)"),
    "flash_attention_4": ("flash-attn-4", (9, 0), "pip install 'flash-attn-4[cu13]' on a Hopper or Blackwell machine (a wheel)"),
}
ATTN_IMPLEMENTATIONS = ("auto", "sdpa", "eager", *FLASH_BACKENDS)


@functools.cache  # a scan of every installed distribution: once per process, not at every model load
def _distributions_of_flash_attn() -> set[str]:
    """Normalised names of the installed distributions that provide the ``flash_attn`` package."""
    if importlib.util.find_spec("flash_attn") is None:
        return set()
    names = importlib.metadata.packages_distributions().get("flash_attn", [])
    return {name.lower().replace("_", "-") for name in names}


def flash_attention_status(implementation: str = "flash_attention_2") -> tuple[bool, str]:
    """Whether ``implementation`` (a flash back-end) can run here, and the reason when it cannot."""
    if implementation not in FLASH_BACKENDS:
        raise ValueError(f"{implementation!r} is not a flash back-end; choose among {tuple(FLASH_BACKENDS)}")
    distribution, capability, install = FLASH_BACKENDS[implementation]
    if not torch.cuda.is_available():
        return False, "flash-attention needs a CUDA GPU and this machine has none"
    if distribution not in _distributions_of_flash_attn():
        return False, f"the {distribution} package is not installed ({install})"
    found = torch.cuda.get_device_capability()
    if found < capability:
        return False, (f"{implementation} needs compute capability ≥ {capability[0]}.{capability[1]} and this GPU "
                       f"({torch.cuda.get_device_name()}) has {found[0]}.{found[1]}")
    return True, f"{distribution} is installed and the GPU can run it"


def runs_flash(model) -> bool:
    """Whether ``model`` runs a flash back-end (its config's attention implementation), e.g. to pack into one row."""
    return str(getattr(getattr(model, "config", None), "_attn_implementation", "") or "").startswith("flash")


def available_flash_backends() -> list[str]:
    """The flash back-ends that can run here, FA2 first."""
    return [name for name in FLASH_BACKENDS if flash_attention_status(name)[0]]


# what "auto" may pick: it is resolved before the model's head dim is known
AUTO_FLASH = tuple(name for name in FLASH_BACKENDS if name not in MEASURED_BACKWARD)


def resolve_attn_implementation(requested: str = "auto", dtype: torch.dtype | None = None) -> str:
    """Map ``"auto"`` to flash-attention 2 where it can run here for a half-precision model (``dtype`` fp16 or
    bf16: flash kernels have no fp32 path), else ``sdpa`` (flash-attn 4 only by name: see the module doc);
    validate the rest."""
    if requested not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"attn_implementation={requested!r} is not one of {ATTN_IMPLEMENTATIONS}")
    if requested == "auto":
        half = dtype in (torch.float16, torch.bfloat16)
        return next((name for name in available_flash_backends() if name in AUTO_FLASH), "sdpa") if half else "sdpa"
    if requested in FLASH_BACKENDS:
        available, reason = flash_attention_status(requested)
        if not available:
            raise AttentionBackendUnavailable(
                f"attn_implementation={requested!r} cannot run: {reason}. "
                "Use attn_implementation='sdpa' (or 'auto', which falls back to sdpa)."
            )
    return requested
