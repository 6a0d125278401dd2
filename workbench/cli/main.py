"""Command line: ``python -m workbench list``, ``run``, ``train``, ``audit``, ``grade`` and ``watch`` (each
sub-command in its own module of this folder).

Exit codes: 0 success, 1 a notebook failed, 2 bad input (unknown notebook or parameter, wrong
type) — the message names the problem and the valid choices, 130 interrupted (Ctrl-C; the report of
what finished is written, ``--out DIR --resume`` runs the rest), 141 ``list``'s reader left early (``| head``; as
a shell reports a writer stopped by SIGPIPE), without a traceback.

Only the chosen sub-command's module is imported (``SUBCOMMANDS``): each process pays for its own imports and
no other's — ``run`` reads and writes notebooks through nbformat, whose jsonschema builds a grammar at import
(about 3 s of CPU), and ``train`` and ``audit`` import transformers, which ``grade`` and ``watch``'s parent process
do not need; ``list`` reads the notebooks' JSON and imports neither torch nor nbformat.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from workbench.core.config_options import count_argument
from workbench.core.errors import InputError, ParameterError

# name: (module of this folder with add_arguments(parser) and main(args), help), imported only when chosen
SUBCOMMANDS = {
    "train": ("workbench.cli.train", "train with PPO, GRPO, DPO or SFT (resumes from --output-dir)"),
    "audit": ("workbench.cli.audit", "run a workbench.audit check on your own loss / log-prob / generate / step function"),
    "grade": ("workbench.cli.grade", "grade submitted exercise notebooks: grades.csv and one feedback page each"),
    "watch": ("workbench.cli.watch", "run a training script with every Hugging Face model it builds watched (workbench.watch)"),
    "inspect": ("workbench.cli.inspect", "read a rollout dump (generic, slime, verl) and report the pitfalls it shows"),
}


READER_LEFT = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader left (`workbench list | head`)


def _list(args) -> int:
    from workbench.catalogue.listing import catalogue  # the notebooks' JSON: no torch, no nbformat

    try:
        for info in catalogue():
            print(f"{info.stem}\n    {info.purpose}")
            print("    parameters: " + ", ".join(f"{k}={v!r}" for k, v in info.parameters.items()))
            if info.smoke_parameters:
                print("    --smoke:    " + ", ".join(f"{k}={v!r}" for k, v in info.smoke_parameters.items()))
        sys.stdout.flush()  # here, not at exit: a reader that left then ends the listing below, not in a traceback
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush goes nowhere
        return READER_LEFT
    return 0


def _run(args) -> int:
    from workbench.catalogue.batch import run_catalogue  # matplotlib behind it (the report): `--help` and `list` stay fast

    if args.resume and not args.out:
        print("error: --resume continues an earlier run: name its folder with --out DIR (e.g. --out runs/20250101-120000)",
              file=sys.stderr)
        return 2
    overrides = {}
    for name, value in args.parameter or []:
        overrides[name] = value
    try:
        out, results = run_catalogue(args.notebooks or None, smoke=args.smoke, overrides=overrides, out_dir=args.out,
                                     progress=not args.quiet, render_html=not args.no_html, jobs_in_parallel=args.jobs,
                                     resume=args.resume)
    except (ParameterError, InputError) as exc:  # RunFolderInUse and an output folder that cannot be made are InputErrors
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    width = max(len(r.stem) for r in results)
    for result in results:
        kept = "  (kept from the earlier run)" if result.kept else ""
        line = f"{result.stem:<{width}}  {result.verdict:<26} {result.seconds:6.1f} s" + kept
        print(line + (f"  {result.error.splitlines()[0]}" if result.error else ""))
    print(f"report: {out / 'index.html'}")
    failed = [r.stem for r in results if not r.ok]
    if failed:
        print(f"{len(failed)} notebook(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _add_command(sub, name: str, chosen: bool) -> None:
    """Sub-command ``name`` of ``SUBCOMMANDS``; its module's ``add_arguments(parser)`` and ``main(args)`` when it is
    the ``chosen`` one (the others appear in ``--help`` by name and help text only)."""
    module_name, help_text = SUBCOMMANDS[name]
    command = sub.add_parser(name, help=help_text)
    if chosen:
        module = importlib.import_module(module_name)
        module.add_arguments(command)
        command.set_defaults(func=module.main)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m workbench", description="RLHF pitfalls workbench")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the notebooks with their parameters and purpose").set_defaults(func=_list)
    run = sub.add_parser("run", help="execute notebooks with papermill and write an HTML report")
    run.add_argument("notebooks", nargs="*", help="notebook stems (e.g. 01_position_ids), prefixes or paths; default: all")
    run.add_argument("--smoke", action="store_true", help="each notebook's own small/fast parameters")
    run.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"), help="set a parameter")
    run.add_argument("--out", default=None, help="output folder (default: runs/<timestamp>)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("-j", "--jobs", type=count_argument, default=2, help="notebooks executed at once (default 2; threads are shared)")
    run.add_argument("--resume", action="store_true",
                     help="with --out DIR of an interrupted run: run only the notebooks without a complete result there "
                          "(same parameters), then report over all")
    run.add_argument("--no-html", action="store_true", help="skip rendering executed notebooks to HTML")
    run.set_defaults(func=_run)
    for name in SUBCOMMANDS:  # the sub-command is the first argument (the top level has no option but --help)
        _add_command(sub, name, chosen=bool(argv) and argv[0] == name)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ParameterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
