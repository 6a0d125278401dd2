"""``WatchCallback``: ``workbench.watch`` inside any ``transformers.Trainer`` (TRL's trainers included).

``trainer = GRPOTrainer(..., callbacks=[WatchCallback()])`` (or ``trainer.add_callback(cb)``):

* at train begin it attaches a ``watch`` to the trainer's model (unwrapped from DDP/accelerate), its
  tokenizer (``processing_class``), its optimiser (unwrapped from accelerate's wrapper) and, when the trainer
  holds one, its reference model (``ref_model``, TRL's name; or the ``reference=`` given here);
* at every log it adds the watch's counters and findings as scalars (``watch/…``, ``Report.scalars``) to the
  trainer's own ``logs``, so they reach whatever ``report_to`` is set and ``state.log_history``; to be seen
  by the reporting callbacks it moves itself to the front of the trainer's callback list;
* at train end it detaches and writes ``report.json`` and ``report.html`` into ``args.output_dir`` (rank 0,
  the ranks' reports merged under DDP); ``cb.report()`` returns the report at any time.

This module imports transformers (the watch's core does not): ``workbench.watch.WatchCallback`` loads it on use.
"""

from __future__ import annotations

import sys

from transformers import TrainerCallback

from workbench.watch.ranks import merged
from workbench.watch.report import Report
from workbench.watch.watcher import Watch


def _unwrap(obj, attribute: str):
    """DDP's ``.module``, accelerate's ``AcceleratedOptimizer.optimizer``: the object that really runs."""
    while obj is not None and hasattr(obj, attribute) and getattr(obj, attribute) is not obj:
        inner = getattr(obj, attribute)
        if inner is None:
            break
        obj = inner
    return obj


class WatchCallback(TrainerCallback):
    """Watch a ``transformers.Trainer``'s run; see the module doc. ``deep=True``: the gradient checks too."""

    def __init__(self, deep: bool = False, reference=None, write_report: bool = True, prefix: str = "watch/"):
        self.deep, self.reference, self.write_report, self.prefix = deep, reference, write_report, prefix
        self.watch: Watch | None = None
        self.paths: tuple[str, str] | None = None
        self._final: Report | None = None

    def report(self) -> Report:
        """The findings so far (the final, rank-merged report after train end)."""
        if self._final is not None:
            return self._final
        return self.watch.report() if self.watch is not None else Report()

    def on_train_begin(self, args, state, control, model=None, processing_class=None, optimizer=None, **kwargs):
        trainer = self._calling_trainer()
        if trainer is not None:  # first in line, so the reporting callbacks see the scalars this one adds
            handler = trainer.callback_handler
            handler.callbacks = [self] + [callback for callback in handler.callbacks if callback is not self]
        reference = self.reference if self.reference is not None else getattr(trainer, "ref_model", None)
        model = _unwrap(model if model is not None else getattr(trainer, "model", None), "module")
        if model is None:
            return
        self._final = None
        self.watch = Watch(model, tokenizer=processing_class, reference=_unwrap(reference, "module"),
                           optimizer=_unwrap(optimizer, "optimizer"), deep=self.deep)
        self.watch.__enter__()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.watch is None or logs is None:
            return
        scalars = self.watch.report().scalars(self.prefix)
        logs.update(scalars)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(scalars)  # the trainer appended this log's copy just before on_log

    def on_train_end(self, args, state, control, **kwargs):
        if self.watch is None:
            return
        self.watch.close()
        self._final = merged(self.watch.report())
        if self._final is not None and self.write_report and args.output_dir and state.is_world_process_zero:
            self.paths = self._final.write(args.output_dir, title=f"workbench.watch report: {args.output_dir}")
        if self._final is None:  # a rank other than 0: its own part
            self._final = self.watch.report()

    def _calling_trainer(self):
        """The ``Trainer`` whose callback handler is calling this callback (found on the call stack)."""
        frame = sys._getframe(1)
        while frame is not None:
            owner = frame.f_locals.get("self")
            handler = getattr(owner, "callback_handler", None)
            if handler is not None and self in getattr(handler, "callbacks", ()):
                return owner
            frame = frame.f_back
        return None
