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


def with_switch_flipped(measure: Callable[[Any, bool], Any], value: Any, switch: bool) -> dict[tuple[Any, bool], Any]:
    """``measure(value, switch)`` and ``measure(value, not switch)``, keyed ``(value, switch)``, the control's setting
    first: an explorer of a bug switch draws the setting the reader chose beside its other side."""
    return {(value, switch): measure(value, switch), (value, not switch): measure(value, not switch)}


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
        header = [widgets.HTML(f"<b>{title}</b>")] if title else []
        self.widget = widgets.VBox(header + [widgets.HBox(list(controls.values())), self.output])
        self._redraw()

    def values(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def _redraw(self, change=None) -> None:
        with self.output:
            clear_output(wait=True)
            self.last = self.draw(**self.values())
            plt.show()
        self.renders += 1

