"""``python -m workbench audit MODULE:FUNCTION --check NAME``: run one audit check from the command line.

Prints the result (``--json``: the result dict, for another process to read back with
``AuditResult.from_dict``). Exit codes: 0 the check passed, 1 it failed, 2 bad input — an unknown
module or function, a callable with the wrong signature, a missing ``--model`` or ``--temperature``
(the message names the problem and the fix).
"""

from __future__ import annotations

import sys

CHECKS = {
    # name: (function name in workbench.audit, needs a model, what the callable looks like)
    "aggregation": ("check_aggregation", False),
    "position_ids": ("check_position_ids", True),
    "temperature": ("check_temperature", True),
    "eos": ("check_eos_stopping", True),
    "step0": ("check_step0", True),
    "dpo_mask": ("check_dpo_mask", False),
    "grad_accumulation": ("check_grad_accumulation", False),
}


def add_arguments(parser) -> None:
    parser.add_argument("target", metavar="MODULE:FUNCTION",
                        help="your callable: a dotted module importable from here or a path to a .py file, then :function")
    parser.add_argument("--check", required=True, choices=sorted(CHECKS), help="which audit check to run")
    parser.add_argument("--model", default=None,
                        help="built-in model name or local checkpoint folder (position_ids, temperature, eos, step0)")
    parser.add_argument("--temperature", type=float, default=None, help="the sampling temperature (temperature check)")
    parser.add_argument("--expect", default=None,
                        help="aggregation: the convention your code claims (verl or TRL name, e.g. seq-mean-token-mean or grpo)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(args) -> int:
    import workbench.audit as audit
    from workbench.audit.loading import load_callable
    from workbench.core.errors import AuditInputError

    function_name, needs_model = CHECKS[args.check]
    if needs_model and not args.model:
        return _error(f"--check {args.check} runs your function on a model: pass --model NAME_OR_PATH "
                      "(e.g. --model tiny-arith-gpt2 or a local checkpoint folder)")
    if args.check == "temperature" and args.temperature is None:
        return _error("--check temperature needs --temperature T, the temperature your trainer samples at (≠ 1)")
    if args.expect is not None and args.check != "aggregation":
        return _error("--expect only applies to --check aggregation")
    try:
        fn = load_callable(args.target)
    except AuditInputError as exc:
        return _error(str(exc))
    kwargs = {}
    if args.check == "aggregation" and args.expect is not None:
        kwargs["expected"] = args.expect
    positional = [fn]
    if needs_model:
        from workbench.experiments.checkpoints import load

        try:
            model, tokenizer = load(args.model)
        except (ValueError, OSError) as exc:
            return _error(f"cannot load --model {args.model!r}: {exc}")
        positional += [model, tokenizer]
    if args.check == "temperature":
        positional.append(args.temperature)
    try:
        result = getattr(audit, function_name)(*positional, **kwargs)
    except (audit.AuditSignatureError, ValueError) as exc:
        return _error(str(exc))
    print(result.to_json() if args.json else result)
    return 0 if result.passed else 1
