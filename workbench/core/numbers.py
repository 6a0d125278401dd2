"""Numbers as a reader sees them: a value, or what is undefined and why — never a raw ``nan``.

A statistic can be undefined for a reason that is not a bug: one seed gives no noise estimate (so no standard error,
threshold or minimum detectable effect), a spread of exactly 0 gives no detectable-effect size, a training step with no
correct response has no mean length of correct responses. Printed as ``nan``, a reader cannot tell that from a bug.
``shown(value, why=…)`` prints the value, or ``n/a (<why>)``; ``why_undefined`` names the reason for a statistic of a
record (a ``prediction`` record, an ``Effect``'s fields). The batch report, the "Does it matter?" table, the statistics'
sentences and the command line print through them.
"""

from __future__ import annotations

import math

ONE_SEED = "one seed: no noise estimate"
NO_SPREAD = "noise 0: no spread to size it"
ONE_SEED_SPREAD = "one seed: no spread over seeds"
NOT_MEASURED = "not measured"
NOISE_STATISTICS = ("se", "noise", "threshold", "mde")  # the fields one seed leaves undefined


def as_number(value) -> float | None:
    """``value`` as a float when it is a number (an int, a float, or the text of one such as the ``"nan"`` that
    ``core.jsonsafe`` writes for NaN); None for anything else (booleans, None, other text)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def is_undefined(value) -> bool:
    """True for a number that is not finite (NaN, ±inf), also as text (``"nan"``)."""
    number = as_number(value)
    return number is not None and not math.isfinite(number)


def shown(value, spec: str = ".3g", why: str = NOT_MEASURED) -> str:
    """``format(value, spec)``, or ``n/a (why)`` when the value is undefined (NaN, ±inf, or their text)."""
    number = as_number(value)
    if number is None:
        return str(value)
    return format(number, spec) if math.isfinite(number) else f"n/a ({why})"


def why_undefined(name: str, record: dict | None = None) -> str:
    """Why the statistic ``name`` of ``record`` is undefined: a noise of exactly 0 (no MDE), one seed (no noise,
    threshold or MDE; no spread over seeds for a ``…over_seeds`` name), else "not measured". ``name`` may be dotted
    (``prediction.mde``): its last part counts."""
    record = record or {}
    field = name.rsplit(".", 1)[-1]
    if field in NOISE_STATISTICS:
        if field == "mde" and as_number(record.get("se", record.get("noise"))) == 0:
            return NO_SPREAD
        if as_number(record.get("seeds")) == 1:
            return ONE_SEED
    if field.endswith("over_seeds"):  # a spread over seeds (std_over_seeds): NaN below two seeds
        return ONE_SEED_SPREAD
    return NOT_MEASURED


def shown_field(name: str, record: dict, spec: str = ".3g") -> str:
    """``record[name]`` shown with the reason ``why_undefined`` gives when it is undefined."""
    return shown(record.get(name), spec, why_undefined(name, record))
