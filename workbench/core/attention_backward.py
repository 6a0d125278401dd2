"""Attention back-ends whose gradients are trusted only where they were measured right: the one map the trainers,
``attn_implementation="auto"`` and the watch read.

Why a map in ``core``: the forward of a back-end can agree with sdpa to the last printed digit while its backward
does not, and a training run shows no error — only updates in other directions. flash-attn 4 (4.0.0b36, H100) is such
a back-end: its dq is wrong at head dims 8, 16, 48 and 80 (and dk/dv too when key/value heads are shared), in the dense
and the variable-length kernel alike, while at 24, 32, 64, 96, 128, 192 and 256 it matches bf16 sdpa (docs/GPU.md,
"flash-attn 4's backward, head dim by head dim"). So the verdict depends on the release, the GPU generation and the
model's head dim, and anything not measured is unverified, not assumed right:

- the trainers refuse to train through an unverified configuration (``trainers.base.check_attention_backward``);
- ``"auto"`` never picks a back-end of this map (it is resolved before the model's head dim is known;
  ``modeling.attention``);
- ``workbench.watch`` flags a training forward of someone else's trainer that takes one (S2).

Torch and the standard library only: the watch runs in peer environments. The verdict itself is a pure function of
(back-end, head dim, release, compute capability); ``unverified_backward_reason`` finds the last three for a model.
``scripts/gpu_check.py --sections kernels,gradients --kernel-map`` measures a new release.
"""

from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass, field

MEASUREMENT_NOTE = "docs/GPU.md"


@dataclass(frozen=True)
class BackwardMeasurement:
    """What was measured for one back-end: per (release, compute capability), the head dims whose gradients matched
    bf16 sdpa's (relative error to fp32 within sdpa's own) and those measured wrong, with a summary of the evidence."""

    distribution: str
    right: dict[tuple[str, str], tuple[int, ...]] = field(default_factory=dict)
    wrong: dict[tuple[str, str], tuple[int, ...]] = field(default_factory=dict)
    evidence: str = ""


MEASURED_BACKWARD = {
    "flash_attention_4": BackwardMeasurement(
        distribution="flash-attn-4",
        right={("4.0.0b36", "9.0"): (24, 32, 64, 96, 128, 192, 256)},
        wrong={("4.0.0b36", "9.0"): (8, 16, 48, 80)},
        evidence=("on an H100 (compute capability 9.0) with flash-attn-4 4.0.0b36, its kernels' dq was wrong at head dims "
                  "8, 16, 48 and 80 — relative error 0.4–0.6 (dense) and 1.1–1.2 (variable-length) against fp32 sdpa, "
                  "where bf16 sdpa's is 0.004 — and dk/dv too when key/value heads are shared, although the forward "
                  "agreed with sdpa; head dims 24, 32, 64, 96, 128, 192 and 256 matched sdpa (2 × 96 tokens dense, sequences "
                  "of 17–36 tokens variable-length; 64 and 128 also at 2048 tokens)"),
    ),
}


@functools.cache  # read at every training forward the watch sees: once per process
def installed_release(implementation: str) -> str | None:
    """The installed version of ``implementation``'s distribution (``flash-attn-4`` for FA4), or None."""
    measured = MEASURED_BACKWARD.get(implementation)
    if measured is None:
        return None
    try:
        return importlib.metadata.version(measured.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def head_dim_of(config, *, text: bool = True) -> int | None:
    """The attention head dim of a Hugging Face config (``head_dim``, else hidden size / heads; GPT-2's names too); with
    ``text``, of its text part (``get_text_config``). None where one number does not describe the kernel's shapes:
    multi-head latent attention (DeepSeek-V2/V3: q/k and v of other widths than ``head_dim``)."""
    if text and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    if any(getattr(config, name, None) for name in ("qk_nope_head_dim", "v_head_dim", "kv_lora_rank")):
        return None
    head_dim = getattr(config, "head_dim", None)
    if isinstance(head_dim, int) and head_dim > 0:
        return head_dim
    if isinstance(getattr(config, "embed_dim", None), int) and isinstance(getattr(config, "num_heads", None), int):
        hidden, heads = config.embed_dim, config.num_heads  # vision towers (Qwen2-VL's: 1280 / 16)
    else:
        hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
        heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 else None


def backward_verdict(implementation: str, head_dim: int | None, release: str | None, capability: str | None) -> str | None:
    """Why training through ``implementation`` at ``head_dim``, with ``release`` of its package on a GPU of compute
    ``capability`` ("9.0"), is not trusted — measured wrong, or not measured — or None where it was measured right
    (and for back-ends outside the map: eager, sdpa, flash-attn 2)."""
    measured = MEASURED_BACKWARD.get(implementation)
    if measured is None:
        return None
    key = (release, capability)
    where = (f"head dim {head_dim} with {measured.distribution} {release or '(release unknown: not installed here)'} "
             f"on compute capability {capability or '(no CUDA GPU seen)'}")
    if head_dim in measured.right.get(key, ()):
        return None
    measured_at = "; ".join(f"{r} on {c}: right at {', '.join(map(str, dims))}" for (r, c), dims in measured.right.items())
    if head_dim in measured.wrong.get(key, ()):
        return (f"attn_implementation={implementation!r} at {where}: its gradients were measured wrong there — "
                f"{measured.evidence} ({MEASUREMENT_NOTE})")
    return (f"attn_implementation={implementation!r} at {where}: its gradients were not verified there ({measured_at}). "
            f"It is trusted only where measured, because {measured.evidence} ({MEASUREMENT_NOTE}). "
            f"`python scripts/gpu_check.py --sections kernels,gradients --kernel-map --head-dims {head_dim}` measures it")


def device_capability(model) -> str | None:
    """The compute capability ("9.0") of the GPUs holding ``model``'s parameters, or None when none is on a GPU or
    they differ (a model split over GPUs of two generations is judged unverified)."""
    import torch  # the verdict above needs no torch; this lookup does

    devices = {p.device for p in model.parameters() if p.device.type == "cuda"} if hasattr(model, "parameters") else set()
    found = {"{}.{}".format(*torch.cuda.get_device_capability(device)) for device in devices}
    return found.pop() if len(found) == 1 else None


def _attention_configs(config):
    """(config, is the top level) for a model's config and each sub-config (a vision tower, a text model), each of which
    may name its own attention back-end (``attn_implementation={"text_config": …, "vision_config": …}``)."""
    yield config, True
    for name in getattr(config, "sub_configs", None) or {}:
        sub = getattr(config, name, None)
        if sub is not None and sub is not config:
            yield sub, False


def unverified_backward_reason(model, *, release: str | None = None, capability: str | None = None) -> str | None:
    """``backward_verdict`` for ``model``: for its config and each sub-config, that config's ``_attn_implementation``
    and head dim; ``release`` (found from the installed package where not given) and ``capability`` (found from the
    model's devices where not given). The first reason found, or None."""
    measured = [(part, top, implementation) for part, top in _attention_configs(getattr(model, "config", None))
                if (implementation := str(getattr(part, "_attn_implementation", "") or "")) in MEASURED_BACKWARD]
    if not measured:  # eager, sdpa, flash-attn 2: no lookup (the watch asks at every training forward)
        return None
    capability = capability or device_capability(model)  # once per model, not per sub-config
    reasons = (backward_verdict(implementation, head_dim_of(part, text=top), release or installed_release(implementation),
                                capability) for part, top, implementation in measured)
    return next((reason for reason in reasons if reason is not None), None)
