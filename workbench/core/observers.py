"""A listener list for code that wants to see the workbench's own sampler from outside (standard library only).

``transformers``' ``generate`` shows its settings to a wrapper (its ``generation_config``); the workbench's
sampler (``modeling.rollout.sample``) is a plain function, so it announces each rollout here instead:
``emit("sample", ...)`` calls every subscribed listener with the settings and the sampled tokens. Nobody
listens unless a ``workbench.watch`` is active, and then ``emit`` costs one function call per rollout.
"""

from __future__ import annotations

_LISTENERS: list = []


def subscribe(listener) -> None:
    """Call ``listener(event, data)`` on every ``emit`` until ``unsubscribe``."""
    _LISTENERS.append(listener)


def unsubscribe(listener) -> None:
    if listener in _LISTENERS:
        _LISTENERS.remove(listener)


def listening() -> bool:
    return bool(_LISTENERS)


def emit(event: str, **data) -> None:
    """Tell every listener about ``event`` (a listener that raises is the listener's bug: not caught)."""
    for listener in list(_LISTENERS):
        listener(event, data)
