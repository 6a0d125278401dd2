"""The child side of ``python -m workbench watch -- python my_train.py …``: loaded by the ``sitecustomize`` the
command puts first on the child's ``PYTHONPATH``, it watches every Hugging Face model the script builds.

* ``install()`` (standard library only, so a child that never loads transformers pays nothing) puts an import
  hook on ``sys.meta_path``; when ``transformers.modeling_utils`` is loaded, ``PreTrainedModel.post_init`` (the
  last step of every model's ``__init__``: ``from_pretrained``, ``from_config``, a class call) is wrapped so each
  new model gets a ``workbench.watch.Watch``. A model built inside another (GPT-2's body inside the LM head)
  hands its watch over to the outer one, so no forward is counted twice.
* At exit (``atexit``; also on Ctrl-C, whose ``KeyboardInterrupt`` unwinds to it, and on SIGTERM, turned into
  ``SystemExit`` when the script left that signal alone) the watches' reports are merged and written as
  ``parts/<pid>.json`` (``parts/rank<R>-<pid>.json`` in a process launched with ``RANK`` set) into the folder named by
  ``WORKBENCH_WATCH_OUT``; the parent merges the parts of every process (torchrun's ranks too: each rank's own part,
  ``tests/integration/test_watch_ranks.py``) into ``report.json`` / ``report.html``.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import json
import os
import signal
import sys

OUT_VARIABLE, DEEP_VARIABLE = "WORKBENCH_WATCH_OUT", "WORKBENCH_WATCH_DEEP"
TARGET = "transformers.modeling_utils"
WATCHES: list = []


class _ModelingHook(importlib.abc.MetaPathFinder):
    """Finds ``transformers.modeling_utils`` with the other finders, then patches it once it has run."""

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def patch(modeling_utils) -> None:
    """Wrap ``PreTrainedModel.post_init`` so every model built from now on is watched."""
    cls = modeling_utils.PreTrainedModel
    original = cls.post_init
    if getattr(original, "_workbench_watch", False):
        return

    def post_init(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        adopt(self)
        return result

    post_init._workbench_watch = True
    cls.post_init = post_init


def adopt(model) -> None:
    """Watch ``model``; a watch already on one of its submodules is closed (the outer watch covers it)."""
    from workbench.watch.watcher import Watch  # torch: loaded by now (transformers built a model)

    inner = {id(m) for m in model.modules()}
    for nested in [w for w in WATCHES if id(w.model) in inner]:
        nested.close()
        WATCHES.remove(nested)
    if any(model is w.model or any(m is model for m in w.model.modules()) for w in WATCHES):
        return
    WATCHES.append(Watch(model, deep=os.environ.get(DEEP_VARIABLE) == "1").__enter__())


def write_part() -> str | None:
    """This process's report (all its watches merged) as ``parts/<pid>.json``; None when it built no model."""
    if not WATCHES or not os.environ.get(OUT_VARIABLE):
        return None
    from workbench.watch.report import Report

    reports = []
    for watch in WATCHES:
        watch.close()
        reports.append(watch.report())
    merged = Report.merge(reports, one_process=True)  # its watches watched the same run at once
    merged.observed["models_watched"] = len(reports)
    folder = os.path.join(os.environ[OUT_VARIABLE], "parts")
    os.makedirs(folder, exist_ok=True)
    rank = os.environ.get("RANK")  # a launched process (torchrun, accelerate launch): its rank named in the part's file
    path = os.path.join(folder, f"rank{rank}-{os.getpid()}.json" if rank is not None else f"{os.getpid()}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(merged.to_dict(), handle)
    os.replace(path + ".tmp", path)
    return path


def _terminate(signum, frame):
    raise SystemExit(128 + signum)


def install() -> None:
    """Called from the generated ``sitecustomize``: the import hook, the exit handler, SIGTERM → SystemExit."""
    if TARGET in sys.modules:
        patch(sys.modules[TARGET])
    elif not any(isinstance(f, _ModelingHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _ModelingHook())
    atexit.register(write_part)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
