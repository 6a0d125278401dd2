"""ipywidgets explorers for the notebooks: controls that redraw a plot.

Every explorer is an ``Explorer``: a set of value widgets, a ``draw(**values)`` function that
plots into the explorer's ``Output`` and returns what it measured, and an observer that calls
``draw`` again whenever a control's ``.value`` changes. The logic is testable without a browser:
set ``explorer.controls["name"].value`` and read ``explorer.last`` / ``explorer.renders``.

Each pitfall's explorers live in its module (``workbench.pitfalls.nbNN_*``), built on this base;
notebooks show ``explorer.widget`` only when their ``interactive`` parameter is true (batch runs
set it to False).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import clear_output

from workbench.core import progress


class Explorer:
    """Controls + an output area redrawn by ``draw(**control_values)`` on every change."""

    def __init__(self, controls: dict[str, widgets.ValueWidget], draw: Callable[..., Any], title: str = ""):
        self.controls = controls
        self.draw = draw
        self.output = widgets.Output()
        self.last: Any = None
        self.renders = 0
        for control in controls.values():
            control.observe(self._redraw, names="value")
            _show_whole_labels(control)
        header = [widgets.HTML(f"<b>{title}</b>")] if title else []
        self.widget = widgets.VBox(header + [widgets.HBox(list(controls.values())), self.output])
        self._redraw()

    def values(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def _redraw(self, change=None) -> None:
        with self.output:
            clear_output(wait=True)
            with progress.hidden():  # a bar would stay in the output above the redrawn figure
                self.last = self.draw(**self.values())
            plt.show()
        self.renders += 1


def _show_whole_labels(control: widgets.ValueWidget) -> None:
    """A control's description and its buttons as wide as their text (ipywidgets cuts both at a fixed width)."""
    if getattr(control, "description", "") and hasattr(control.style, "description_width"):
        control.style.description_width = "initial"
    if isinstance(control, widgets.ToggleButtons):
        control.style.button_width = "auto"
    if isinstance(control, widgets.Dropdown):
        control.layout.width = "max-content"


def with_switch_flipped(measure: Callable[[Any, bool], Any], value: Any, switch: bool) -> dict[tuple[Any, bool], Any]:
    """``measure(value, switch)`` and ``measure(value, not switch)``, keyed ``(value, switch)``, the reader's setting
    first."""
    return {(value, switch): measure(value, switch), (value, not switch): measure(value, not switch)}


def switch_explorer(measure: Callable[..., Any], plot: Callable[[Any, dict], None], *, value: tuple[str, widgets.ValueWidget],
                    switch: tuple[str, widgets.Checkbox], title: str, figsize=(6, 3), panels: int = 1) -> Explorer:
    """An explorer of one setting (a slider) and the fix's switch (a checkbox). Each redraw calls
    ``measure(<value name>=…, <switch name>=…)`` with the switch as the reader set it and flipped, draws both with
    ``plot(ax, results)`` (``plot(axes, …)`` for ``panels`` > 1; results keyed ``(value, switch)``) and keeps the
    reader's side as ``explorer.last``."""
    (value_name, value_control), (switch_name, switch_control) = value, switch

    def draw(**values):
        results = with_switch_flipped(lambda v, s: measure(**{value_name: v, switch_name: s}),
                                      values[value_name], values[switch_name])
        fig, axes = plt.subplots(1, panels, figsize=figsize)
        plot(axes, results)
        return results[values[value_name], values[switch_name]]

    return Explorer({value_name: value_control, switch_name: switch_control}, draw, title)
