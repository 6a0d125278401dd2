"""Where a watched call came from: ``call_site()``, the file:line of the nearest frame outside torch, transformers,
accelerate, the standard library's call wrappers, the workbench's forward implementations and this package. Findings
are keyed by it, so a finding points at the line of the user's trainer that made the call, and one line's repeated
calls make one finding.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import torch

from workbench.core import observers

_OWN_DIRS = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(__file__) + os.sep, observers.__file__)
_OWN_NAMES = (os.sep + "transformers" + os.sep, os.sep + "torch" + os.sep, os.sep + "accelerate" + os.sep, "<frozen ")
# the standard library's modules whose frames sit between a caller and the call it wraps (partial, wraps, contextmanager)
_STDLIB_WRAPPERS = frozenset((functools.__file__, contextlib.__file__))


def call_site() -> str:
    """file:line of the nearest caller outside torch, transformers, accelerate, the standard library's functools.py
    and contextlib.py, the files registered with ``observers.register_forward_implementation`` (the workbench's
    fast paths: the static-cache decoder, the inline training body) and this package; "?" when none is."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not _skipped(name):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _skipped(filename: str) -> bool:
    """Whether a frame of ``filename`` belongs to the machinery between the user's line and the watched call."""
    return (filename.startswith(_OWN_DIRS) or any(part in filename for part in _OWN_NAMES) or filename in _STDLIB_WRAPPERS
            or filename in observers.FORWARD_IMPLEMENTATIONS)
