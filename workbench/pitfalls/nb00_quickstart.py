"""Notebook 00, the quickstart: padding, attention masks and position ids, shown on one model.

A left-padded batch, the positions a Hugging Face model assumes for it (0..T−1 in every row) beside the positions
derived from the mask, and what the difference does: the largest change in a token's log-probability between
scoring each text alone and inside the padded batch, without and with mask-derived position ids. The drift per
text is measured by ``nb01_position_ids.per_text_drift`` and drawn by ``nb01_position_ids.figure_drift_per_text``
(the figure its explorer redraws), and judged by ``nb01_position_ids.verdict`` and ``not_shown``, so notebook 00
imports both modules; this one holds the quickstart's own figure, reading and metrics.
"""

from __future__ import annotations

import torch

from workbench.core.batching import position_ids_from_mask
from workbench.modeling.models import uses_rope
from workbench.viz import plots

DriftPerText = dict[str, list[float]]  # {"model": drift per text without position ids (bug), "mask": with them (fix)}


# ---- figures ------------------------------------------------------------------------------------
def tint_positions(ax, bug: bool) -> None:
    """Recolour a ``plots.plot_positions`` grid by convention: bug in oranges (vermilion family), fix in blues,
    so the panel with the bug's positions never reads as the fix."""
    for image in ax.get_images():
        image.set_cmap("Oranges" if bug else "Blues")


def figure_padding_and_positions(ids: torch.Tensor, mask: torch.Tensor):
    """A left-padded batch's attention mask, the positions the model assumes (bug, oranges) and the positions
    derived from the mask (fix, blues); the details are in ``padding_note``."""
    fig, axes = plots.panel_grid(3, panel_height=2.6)
    plots.plot_mask(axes[0], mask, "attention mask", key=False)
    plots.plot_positions(axes[1], torch.arange(ids.shape[1]).expand_as(ids), mask, "positions assumed (bug)")
    plots.plot_positions(axes[2], position_ids_from_mask(mask), mask, "positions from mask (fix)")
    tint_positions(axes[1], bug=True)
    tint_positions(axes[2], bug=False)
    for ax in axes[1:]:
        ax.set_ylabel("")
    fig.tight_layout()
    return fig


# ---- printers -----------------------------------------------------------------------------------
def padding_note() -> str:
    """The caption of ``figure_padding_and_positions``."""
    return ("Left: the attention mask of the left-padded batch (pale: pad, 0; blue: real token, 1). Middle: the positions "
            "0..T−1 a Hugging Face model assumes when it is given no position_ids (bug, oranges). Right: position_ids = "
            "cumsum(mask) − 1, the first real token at 0 in every row (fix, blues). Pad cells are blank.")


def conclusion_sentence(model_name: str, model, drift: DriftPerText, reproduced: bool, not_shown: str | None, *,
                        fixed: bool) -> str:
    """The reading of the drift per text, of ``nb01_position_ids.verdict``'s ``(reproduced, fixed)`` and of its
    ``not_shown`` (why this checkpoint cannot show the drift, or None), printed from the measured numbers."""
    if not reproduced:
        reading = f"no drift above float noise without the fix: {not_shown or 'this checkpoint hides the bug'}."
    elif fixed:
        reading = "the padding changes the log-probs; with the fix the drift is 0 up to float rounding."
    else:
        reading = "the padding changes the log-probs, and the fix leaves a drift above float rounding."
    return (f"max |Δ log p| without position ids: {max(drift['model']):.2e} nats; "
            f"with mask-derived position ids: {max(drift['mask']):.2e}\n"
            f"{model_name} ({'rotary' if uses_rope(model) else 'learned absolute'} positions): {reading}")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(model_name: str, drift: DriftPerText, *, reproduced: bool, fixed: bool, not_shown: str | None) -> dict:
    """Notebook 00's ``notebook_api.write_metrics`` keyword arguments (``reproduced``, ``fixed``, ``not_shown``: from
    ``nb01_position_ids.verdict`` and ``not_shown`` on the largest drift per mode)."""
    bug, fix = max(drift["model"]), max(drift["mask"])
    return {"notebook": "00_quickstart", "reproduced": reproduced, "fixed": fixed, "not_shown": not_shown,
            "metrics": {"drift_without_position_ids": bug, "drift_with_position_ids": fix},
            "headline": {"what": f"max |Δ log p| of a text in a left-padded batch vs alone ({model_name})", "unit": "nats",
                         "bug": bug, "fix": fix}}
