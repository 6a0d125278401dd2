"""Exceptions shared across modules."""


class NonFiniteError(FloatingPointError):
    """A loss, gradient or logit became NaN or infinite; the run stopped before corrupting the weights."""
