"""Run every audit check on a set of callables at once, and the notebook's verdict.

``run_checks({"aggregation": loss_fn, "position_ids": logprob_fn, ...}, model, tokenizer,
temperature=0.7, expect="grpo", label="mine")`` runs the check of each key it is given (keys:
``CHECK_NAMES``) and returns their results in that order, each labelled (``details["label"]``) so
one ``report`` can hold several trainers. ``verdict(buggy, fixed)`` is the notebook's
``(reproduced, fixed)``: every check fails on the buggy callables and passes on the fixed ones.
"""

from __future__ import annotations

from workbench.audit.accumulation import check_grad_accumulation
from workbench.audit.aggregation import check_aggregation
from workbench.audit.dpo import check_dpo_mask
from workbench.audit.generation import check_eos_stopping
from workbench.audit.logprobs import check_position_ids, check_temperature
from workbench.audit.result import AuditResult
from workbench.audit.step0 import check_step0

CHECK_NAMES = ("aggregation", "position_ids", "temperature", "eos", "step0", "dpo_mask", "grad_accumulation")
NEEDS_MODEL = ("position_ids", "temperature", "eos", "step0")


def run_checks(callables: dict, model=None, tokenizer=None, *, temperature: float | None = None, expect: str | None = None,
               label: str = "", on_check=None) -> list[AuditResult]:
    """The results of the checks named by ``callables``' keys, in ``CHECK_NAMES`` order; ``on_check(result)``, when
    given, is called after each check (a progress bar's update: the model checks take seconds each)."""
    unknown = set(callables) - set(CHECK_NAMES)
    if unknown:
        raise ValueError(f"unknown check name(s) {sorted(unknown)}; use {CHECK_NAMES}")
    if any(name in callables for name in NEEDS_MODEL) and (model is None or tokenizer is None):
        raise ValueError(f"the checks {[n for n in NEEDS_MODEL if n in callables]} need model= and tokenizer=")
    if "temperature" in callables and temperature is None:
        raise ValueError("the temperature check needs temperature=, the temperature your trainer samples at")
    runners = {
        "aggregation": lambda fn: check_aggregation(fn, expected=expect),
        "position_ids": lambda fn: check_position_ids(fn, model, tokenizer),
        "temperature": lambda fn: check_temperature(fn, model, tokenizer, temperature),
        "eos": lambda fn: check_eos_stopping(fn, model, tokenizer),
        "step0": lambda fn: check_step0(fn, model, tokenizer),
        "dpo_mask": check_dpo_mask,
        "grad_accumulation": check_grad_accumulation,
    }
    results = []
    for name in CHECK_NAMES:
        if name in callables:
            result = runners[name](callables[name])
            if label:
                result.details["label"] = label
            results.append(result)
            if on_check is not None:
                on_check(result)
    return results


def count_failing(results) -> int:
    return sum(not (r.passed if isinstance(r, AuditResult) else r["passed"]) for r in results)


def verdict(buggy: list, fixed: list) -> tuple[bool, bool]:
    """``(reproduced, fixed)``: every buggy callable fails its check, every fixed one passes."""
    reproduced = bool(buggy) and count_failing(buggy) == len(buggy)
    return reproduced, bool(fixed) and count_failing(fixed) == 0
