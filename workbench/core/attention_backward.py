"""Attention back-ends whose gradients were measured wrong: the one list the trainers, ``attn_implementation="auto"``
and the watch read.

Why a list in ``core``: the forward of a back-end can agree with sdpa to the last printed digit while its backward
does not, and a training run shows no error — only updates in other directions. The trainers refuse to train through
a listed back-end (``trainers.base.check_attention_backward``), ``"auto"`` never picks one
(``modeling.attention``), and ``workbench.watch`` flags a training forward of someone else's trainer that takes one
(S2). Standard library only: the watch and the audit run in peer environments.

Each entry is what was measured, where, and with which versions (docs/GPU.md). ``scripts/gpu_check.py --sections
gradients`` measures it again for a later release.
"""

UNVERIFIED_BACKWARD = {
    "flash_attention_4": (
        "its gradients through padded or packed batches (the variable-length kernel) were measured wrong on an H100 — "
        "relative error 0.3–1.1 per parameter group against fp32 eager, where sdpa's is 0.005–0.008 — with flash-attn-4 "
        "4.0.0b36 and transformers 5.23, although its forward agreed with sdpa (docs/GPU.md, 2026-11-26)"),
}


def unverified_backward_reason(model) -> str | None:
    """Why training through ``model``'s attention back-end (its config's ``_attn_implementation``) is not trusted, or
    None."""
    implementation = str(getattr(getattr(model, "config", None), "_attn_implementation", "") or "")
    reason = UNVERIFIED_BACKWARD.get(implementation)
    return None if reason is None else f"attn_implementation={implementation!r}: {reason}"
