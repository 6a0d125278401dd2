"""Inspect a rollout dump brought home from a run elsewhere (verl, slime, TRL with vLLM): ``inspect(path_or_records,
model=None)`` reads it once, streaming, and reports which known pitfall each symptom points to — pitfall id, severity,
message, the numbers as evidence — in the watch's report type, with verl's ``rollout_corr/`` diagnostics.

``python -m workbench inspect PATH…`` is the command line (``workbench.cli.inspect``). Formats: ``records`` (the
generic one), ``readers`` (generic JSONL/Parquet, slime, verl); checks: ``findings`` and ``gaps``; ``rescore`` (with a
model). ``from workbench import inspect`` gives this module, callable as the ``inspect`` function.
"""

import sys
import types

from workbench.inspect.inspector import inspect
from workbench.inspect.records import DumpError, Rollout, validate
from workbench.inspect.report import InspectReport

__all__ = ["DumpError", "InspectReport", "Rollout", "inspect", "validate"]


class _CallableModule(types.ModuleType):
    """``workbench.inspect(path)`` works whether ``inspect`` names the module or the function."""

    def __call__(self, *args, **kwargs) -> InspectReport:
        return inspect(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
