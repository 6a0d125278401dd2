"""Watch a real training run: ``with watch(model, tokenizer=tok) as w: trainer.step(batch)`` observes the
run's own forward and generate calls (hooks, no adapters) and ``w.report()`` lists the pitfalls they show —
pitfall id, severity, numbers as evidence, the call site — plus what no observation can decide (the loss
reduction: S5, P10) with the ``workbench.audit`` check to run instead.

Like ``workbench.audit`` this package imports only torch and the standard library (and the workbench's
stdlib-only ``core.observers`` and ``core.jsonsafe``, and the torch-only
``core.rollout_correction``), so it runs inside the peer lab's environments too.
``WatchCallback`` (a transformers ``TrainerCallback``) lives in ``workbench.watch.callback``, imported on use.

``from workbench import watch`` gives this module, callable as the ``watch`` function.
"""

import sys
import types

from workbench.watch.callsite import call_site
from workbench.watch.report import NOT_OBSERVABLE, Finding, Report
from workbench.watch.watcher import Watch, watch

__all__ = ["NOT_OBSERVABLE", "Finding", "Report", "Watch", "WatchCallback", "call_site", "watch"]


def __getattr__(name: str):
    if name == "WatchCallback":
        from workbench.watch.callback import WatchCallback  # transformers: on use, keeps the core torch-only

        return WatchCallback
    raise AttributeError(f"module 'workbench.watch' has no attribute {name!r}")


class _CallableModule(types.ModuleType):
    """``workbench.watch(model, ...)`` works whether ``watch`` names the module or the function."""

    def __call__(self, *args, **kwargs) -> Watch:
        return watch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
