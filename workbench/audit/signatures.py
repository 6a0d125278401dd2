"""Checking that a user's callable has the signature an audit check expects.

A check calls someone else's function on crafted inputs. When that function takes other
arguments, the error should say what the check expected, not surface as a confusing
``TypeError`` from deep inside the check. Two layers:

* ``require_signature``: before any call, ``inspect.signature(fn).bind(...)`` with the number of
  positional arguments the check will pass;
* ``first_call``: the first call is wrapped, and a ``TypeError`` raised by the call itself (not
  from inside the function's body) becomes an ``AuditSignatureError``. A ``TypeError`` raised
  deeper in the user's code is re-raised with the expected signature added to the message.

Only the standard library and torch are imported here (see ``workbench.audit``).
"""

from __future__ import annotations

import inspect

import torch

from workbench.core.errors import AuditSignatureError


def describe(fn) -> str:
    """``module.name(params)`` of a callable, for error messages."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    module = getattr(fn, "__module__", None)
    try:
        params = str(inspect.signature(fn))
    except (TypeError, ValueError):
        params = "(...)"
    return f"{module + '.' if module else ''}{name}{params}"


def require_signature(fn, check: str, expected: str, n_positional: int) -> None:
    """Raise ``AuditSignatureError`` unless ``fn`` accepts ``n_positional`` positional arguments."""
    if not callable(fn):
        raise AuditSignatureError(f"{check}: expected a callable {expected}, got {type(fn).__name__} {fn!r}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins or C functions without a signature: the first call decides
    try:
        signature.bind(*range(n_positional))
    except TypeError as exc:
        raise AuditSignatureError(
            f"{check}: {describe(fn)} cannot be called as {expected} ({exc}). "
            f"Wrap your code in a function with exactly that signature."
        ) from None


def first_call(fn, check: str, expected: str, *args):
    """Call ``fn(*args)``; a ``TypeError`` from the call becomes an ``AuditSignatureError``."""
    try:
        return fn(*args)
    except TypeError as exc:
        raise AuditSignatureError(
            f"{check}: calling {describe(fn)} as {expected} raised TypeError: {exc}. "
            f"The check passes exactly the arguments of {expected}; adapt your wrapper to it."
        ) from exc


def require_tensor(value, check: str, expected: str, shape: tuple | None = None) -> torch.Tensor:
    """The value a user callable returned, checked to be a tensor (of ``shape`` when given)."""
    if isinstance(value, (int, float)) and shape == ():
        return torch.tensor(float(value))
    if not isinstance(value, torch.Tensor):
        raise AuditSignatureError(f"{check}: {expected} must return a torch.Tensor, got {type(value).__name__}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise AuditSignatureError(
            f"{check}: {expected} returned a tensor of shape {tuple(value.shape)}, expected {tuple(shape)}"
        )
    return value
