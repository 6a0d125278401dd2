"""A listener list for code that wants to see the workbench's own sampler and fast forwards from outside
(standard library only).

``transformers``' ``generate`` shows its settings to a wrapper (its ``generation_config``); the workbench's
sampler (``modeling.rollout.sample``) is a plain function, so it announces each rollout here instead:
``emit("sample", ...)`` calls every subscribed listener with the settings and the sampled tokens. Nobody
listens unless a ``workbench.watch`` is active, and then ``emit`` costs one function call per rollout.

**Forwards that skip ``model(...)``.** The workbench's fast paths (``modeling.decode.StaticDecoder``: the
sampler's prefill and decode steps; ``modeling.inline_body``: the prefix-tree training forward) compute what
``model(...)`` / ``model.model(...)`` would, as plain tensor ops, so a forward hook on the model never sees
them. A listener that observes forwards through hooks can *cover* its hooks instead of switching the fast
paths off: ``cover(hook)`` says "this hook's observations arrive as forward events", and a fast path then
ignores that hook when it decides whether it may run (any uncovered hook still sends it to ``model(...)``),
and for every call it makes in place of the model it emits, while anyone listens:

* ``emit("forward", model=<the CausalLM>, part="model" | "body", inputs={...})`` before the computation:
  ``part`` names the call it stands for (``model(**inputs)`` or its transformer body ``model.model(**inputs)``),
  ``inputs`` the keyword arguments that call would have received (``input_ids``, ``attention_mask``,
  ``position_ids``, ``past_key_values``, ``use_cache``). A fast path's KV cache stands for itself: an object
  with ``get_seq_length()``, the same object for every call of one decoding;
* ``emit("forward_done", model=..., part=..., outputs={...})`` after it, also when it raised (``outputs`` then
  empty): the attributes the call's output would have had that an observer reads (``past_key_values``,
  ``last_hidden_state``, the latter still attached to the autograd graph).

Grad mode, inference mode and the model's train/eval mode are those of the surrounding code when the events
are emitted, as in a hook. The files of the fast paths are registered with ``register_forward_implementation``
so that a listener's "call site" (the first frame outside the implementation of the forward) skips them like
it skips ``torch``'s and ``transformers``' own frames.
"""

from __future__ import annotations

_LISTENERS: list = []
_COVERED: dict[int, object] = {}  # id(hook) → hook (kept alive while covered, so its id cannot be reused)
FORWARD_IMPLEMENTATIONS: set[str] = set()  # source files of forwards that emit "forward" events


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


def cover(hook) -> None:
    """Declare that ``hook`` (a module forward/pre-forward hook a subscribed listener registered) receives the
    fast paths' ``forward`` events instead: a fast path may run on a module carrying it (see module doc)."""
    _COVERED[id(hook)] = hook


def uncover(hook) -> None:
    _COVERED.pop(id(hook), None)


def covered(hook) -> bool:
    """True when ``hook`` was declared by ``cover`` (and not ``uncover``-ed since)."""
    return _COVERED.get(id(hook)) is hook


def register_forward_implementation(path: str) -> None:
    """``path`` (a module's ``__file__``) computes forwards in place of the model and emits their events."""
    FORWARD_IMPLEMENTATIONS.add(path)


def forward_call(model, part: str, inputs: dict, compute, outputs):
    """``compute()`` between a ``forward`` and a ``forward_done`` event (see module doc); ``outputs(result)`` gives
    the latter's ``outputs``. For a fast path to call when ``listening()``; returns ``compute()``'s result."""
    emit("forward", model=model, part=part, inputs=inputs)
    reported: dict = {}
    try:
        result = compute()
        reported = outputs(result)
        return result
    finally:
        emit("forward_done", model=model, part=part, outputs=reported)
