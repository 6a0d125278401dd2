"""``python -m workbench audit MODULE:FUNCTION --check NAME``: run one audit check from the command line.

Prints the result (``--json``: the result dict, for another process to read back with
``AuditResult.from_dict``). Exit codes, so that a CI step can tell a detected bug from a broken setup:

* 0 — the check passed;
* 1 — the check failed: it detected the pitfall in your function;
* 2 — bad input: an unknown module or function, a callable with the wrong signature or return
  value, a missing ``--model`` or ``--temperature`` (the message names the problem and the fix);
* 3 — your function crashed while the check called it (an exception raised inside your code, e.g.
  an ``IndexError`` from indexing what it was passed): not a detected bug; the message shows the
  innermost line of your file that raised.

``--dropout P`` sets every dropout probability of the loaded model to ``P`` (step0: exercises P7 on a
model whose config has none).
"""

from __future__ import annotations

import inspect
import sys
import traceback
from pathlib import Path

import workbench.audit as audit
from workbench.audit.loading import load_callable
from workbench.core.errors import AuditInputError
from workbench.experiments.checkpoints import load

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
    parser.add_argument("--dropout", type=float, default=None, metavar="P",
                        help="set the loaded model's dropout probabilities to P (step0: exercise pitfall P7, e.g. 0.1)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _source_file(fn) -> Path | None:
    try:
        return Path(inspect.getsourcefile(inspect.unwrap(fn))).resolve()
    except (TypeError, ValueError):
        return None


def user_frame(exc: BaseException, fn) -> traceback.FrameSummary | None:
    """The innermost frame of ``fn``'s source file in the traceback of ``exc`` (or of its cause), or None
    when the exception did not pass through the user's code (the check's own error)."""
    source = _source_file(fn)
    if source is None:
        return None
    for error in (exc, exc.__cause__):
        if error is None:
            continue
        frames = [f for f in traceback.extract_tb(error.__traceback__) if Path(f.filename).resolve() == source]
        if frames:
            return frames[-1]
    return None


def crash_message(exc: BaseException, frame: traceback.FrameSummary, target: str, check: str) -> str:
    """Exit 3's message: the user's line that raised, and that this is no verdict of the check."""
    error = exc.__cause__ if exc.__cause__ is not None else exc  # first_call wraps a TypeError: show the user's own
    line = f"\n    {frame.line}" if frame.line else ""
    return (f"crash: {target} raised {type(error).__name__}: {error}\n"
            f"  File \"{frame.filename}\", line {frame.lineno}, in {frame.name}{line}\n"
            f"This is a crash of the audited function, not a bug detected by --check {check} (exit 3): "
            f"run your function on the inputs the check passes (see `python -m workbench audit --help` and the "
            f"check's docstring) and fix the error above.")


def main(args) -> int:
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
        try:
            model, tokenizer = load(args.model)
        except (ValueError, OSError) as exc:
            return _error(f"cannot load --model {args.model!r}: {exc}")
        if args.dropout is not None:
            if not 0.0 <= args.dropout < 1.0:
                return _error(f"--dropout {args.dropout}: a probability in [0, 1), e.g. --dropout 0.1")
            from workbench.pitfalls.nb07_dropout import set_dropout  # matplotlib, ipywidgets: --help loads this module

            set_dropout(model, args.dropout)
        positional += [model, tokenizer]
    elif args.dropout is not None:
        return _error(f"--dropout applies to a loaded --model; --check {args.check} runs without one")
    if args.check == "temperature":
        positional.append(args.temperature)
    try:
        result = getattr(audit, function_name)(*positional, **kwargs)
    except Exception as exc:
        frame = user_frame(exc, fn)
        if frame is not None and not (isinstance(exc, audit.AuditSignatureError) and exc.__cause__ is None):
            print(crash_message(exc, frame, args.target, args.check), file=sys.stderr)
            return 3
        if isinstance(exc, (audit.AuditSignatureError, ValueError)):
            return _error(str(exc))
        raise
    print(result.to_json() if args.json else result)
    return 0 if result.passed else 1
