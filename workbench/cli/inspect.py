"""``python -m workbench inspect PATH… [--model CKPT] [--format auto|generic|slime|verl] [--out DIR] [--json]``:
read a rollout dump and report the pitfalls its numbers point to (``workbench.inspect``).

Prints the findings (or, with ``--json``, the report's JSON on stdout); ``--out DIR`` writes ``report.json`` and
``report.html`` there. Exit codes: 0 no finding of error severity, 1 findings of error severity, 2 bad input (the file
and line, or record, named with the fix), 3 the inspector itself failed (a bug: the traceback is printed).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

from workbench.inspect import DumpError, inspect
from workbench.inspect.readers import FORMATS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="dump files or folders (.jsonl, .parquet, slime's .pt)")
    parser.add_argument("--model", default=None, help="checkpoint: tokenise and score text-only dumps, find the temperature "
                                                      "the rollout's log-probs were taken at (P6)")
    parser.add_argument("--format", choices=FORMATS, default="auto", help="dump format (default: from each file)")
    parser.add_argument("--eos-token-id", type=int, default=None, help="the EOS id (default: the last token of stopped responses)")
    parser.add_argument("--out", default=None, help="folder for report.json and report.html")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of text")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args) -> int:
    try:
        report = inspect(args.paths if len(args.paths) > 1 else args.paths[0], model=args.model, format=args.format,
                         eos_token_id=args.eos_token_id, show_progress=not args.quiet)
    except DumpError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception:  # noqa: BLE001 - anything else is the inspector's own failure
        traceback.print_exc()
        print("error: the inspector failed (above); please report it with the dump's first lines", file=sys.stderr)
        return 3
    print(json.dumps(report.to_dict(), indent=1) if args.json else report)
    if args.out:
        json_path, html_path = report.write(args.out, title=f"workbench inspect: {' '.join(args.paths)}")
        print(f"report: {html_path} ({json_path})", file=sys.stderr if args.json else sys.stdout)
    return 1 if report.errors else 0
