"""One function: make a value JSON-safe (standard library only, so the audit checks and the peer
probes, which run inside other projects' environments, can use it too)."""

from __future__ import annotations

import math


def jsonable(value):
    """Tensors/numpy to Python numbers and lists, tuples to lists, dict keys to strings, and NaN/inf
    to strings (JSON has neither)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
