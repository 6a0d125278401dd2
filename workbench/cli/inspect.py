"""``python -m workbench inspect PATH… [--model CKPT] [--format auto|generic|slime|verl] [--out DIR] [--json]``:
read a rollout dump and report the pitfalls its numbers point to (``workbench.inspect``).

Prints the findings (or, with ``--json``, the report's JSON on stdout); ``--out DIR`` writes ``report.json`` and
``report.html`` there. Exit codes: 0 no finding of error severity, 1 findings of error severity, 2 bad input (the file
and line, or record, named with the fix), 3 the inspector itself failed (a bug: the traceback is printed).

``--report-to trackio wandb tensorboard`` logs the report through ``workbench.core.trackers``, the path ``train`` and
``watch`` use: each step's ``rollout_corr/`` diagnostics (``per_step``) at that step, then the findings' counts
(``inspect/…``) and the whole dump's metrics (``overall/rollout_corr/…``) at the last step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import traceback

from workbench.core.errors import InputError
from workbench.core.trackers import TRACKERS, check_installed, open_trackers
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
    parser.add_argument("--report-to", nargs="+", choices=("none", *TRACKERS), default=["none"], metavar="TRACKER",
                        help="tensorboard (into --out), trackio, wandb (several at once) or none: the per-step diagnostics "
                             "and the report's counts as scalars; trackio and wandb need the trackers extra")


def summary_scalars(report) -> dict[str, float]:
    """``report.scalars("inspect/")`` with the whole dump's metrics under ``overall/`` (``overall/rollout_corr/k3_kl``),
    apart from the per-step values of the same names."""
    return {(f"overall/{name}" if name in report.metrics else name): value for name, value in report.scalars("inspect/").items()}


def log_report(report, names: list[str], out: str | None, run_name: str) -> list[str]:
    """The report's scalars to the trackers ``names``: ``per_step`` at each step, ``summary_scalars`` at the last
    step; returns where each tracker wrote."""
    steps = sorted(report.per_step)
    with open_trackers(names, output_dir=out, run_name=run_name) as trackers:
        for step in steps:
            trackers.log(report.per_step[step], step)
        trackers.log(summary_scalars(report), steps[-1] if steps else 0)
        return trackers.where


def main(args) -> int:
    try:  # a missing tracker package is bad input, said before the dump is read
        names = check_installed(args.report_to)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
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
    if names:
        try:  # with --json, stdout holds the JSON only: the trackers' own messages go to stderr
            with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
                where = log_report(report, names, args.out, run_name="inspect")
            for line in where:
                print(f"logged the report to {line}", file=sys.stderr if args.json else sys.stdout)
        except InputError as exc:  # tensorboard without --out
            print(f"error: {exc.args[0].replace('--output-dir', '--out')}", file=sys.stderr)
            return 2
    return 1 if report.errors else 0
