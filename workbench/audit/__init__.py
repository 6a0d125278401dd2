"""Audit your own trainer: run anyone's loss, log-prob, generation or step function on crafted
inputs and report the convention it implements — no source reading.

Every check takes plain callables (signatures in each check's docstring) and returns an
``AuditResult`` (``name``, ``passed``, ``convention``, ``details``; ``str()`` is one line,
``.plot(ax)`` draws its figure, ``to_dict``/``from_dict`` round-trip through JSON).
``report(results)`` tabulates several (``fmt="html"`` for HTML).

Importing this package loads only the standard library and torch (no transformers, no other
workbench module that needs it): the peer lab runs these checks inside virtual environments
holding other transformers/TRL versions. Checks that need a model get it from the caller.
"""

from workbench.audit.accumulation import check_grad_accumulation
from workbench.audit.aggregation import check_aggregation
from workbench.audit.dpo import check_dpo_mask
from workbench.audit.generation import check_eos_stopping
from workbench.audit.logprobs import check_position_ids, check_temperature
from workbench.audit.result import AuditResult, report, report_html
from workbench.audit.rewards import check_reward_placement, check_reward_pooling
from workbench.audit.schedules import check_old_logprob_guard
from workbench.audit.step0 import check_step0
from workbench.audit.suite import CHECK_NAMES, run_checks, verdict
from workbench.core.errors import AuditSignatureError

__all__ = [
    "CHECK_NAMES",
    "AuditResult",
    "AuditSignatureError",
    "check_aggregation",
    "check_dpo_mask",
    "check_eos_stopping",
    "check_grad_accumulation",
    "check_old_logprob_guard",
    "check_position_ids",
    "check_reward_placement",
    "check_reward_pooling",
    "check_step0",
    "check_temperature",
    "report",
    "report_html",
    "run_checks",
    "verdict",
]
