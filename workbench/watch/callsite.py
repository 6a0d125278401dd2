"""Where a watched call came from: ``call_site()``, the file:line of the nearest frame outside torch, transformers,
accelerate, the workbench's forward implementations and this package. Findings are keyed by it, so a finding points
at the line of the user's trainer that made the call, and one line's repeated calls make one finding.
"""

from __future__ import annotations

import os
import sys

import torch

from workbench.core import observers

_OWN_DIRS = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(__file__) + os.sep, observers.__file__)
_OWN_NAMES = (os.sep + "transformers" + os.sep, os.sep + "torch" + os.sep, os.sep + "accelerate" + os.sep, "<frozen ", "contextlib.py",
              "functools.py")


def call_site() -> str:
    """file:line of the nearest caller outside torch, transformers, accelerate and this package; "?" when none is."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if (not name.startswith(_OWN_DIRS) and not any(part in name for part in _OWN_NAMES)
                and name not in observers.FORWARD_IMPLEMENTATIONS):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"
