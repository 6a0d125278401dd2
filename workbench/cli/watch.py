"""``python -m workbench watch [--out DIR] [--deep] -- python my_train.py ARGS…``: run a training script with
every Hugging Face model it builds watched (``workbench.watch``), no change to the script.

The script runs in a child process whose ``PYTHONPATH`` starts with a folder holding a generated
``sitecustomize.py`` that calls ``workbench.cli.watch_child.install()`` (see there). Each child process that
built a model writes its report into ``DIR/parts``; when the script ends (also on Ctrl-C: the terminal sends
SIGINT to the script, which unwinds and writes; this command waits for it) the parts are merged into
``DIR/report.json`` and ``DIR/report.html`` and the findings printed.

Exit codes: 0 the script succeeded and no finding of error severity; 1 findings of error severity; 2 bad input
(no command, a command that cannot be started); 3 the script itself failed (non-zero exit; the report is
still written); 130 interrupted (Ctrl-C; the report of what ran is written).

``--report-to trackio wandb tensorboard`` logs the merged report's counters (``watch/…``, ``Report.scalars``) as one
point at step 0 through ``workbench.core.trackers``, the path ``train --report-to`` uses.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workbench.cli.watch_child import DEEP_VARIABLE, OUT_VARIABLE
from workbench.core.errors import InputError
from workbench.core.trackers import TRACKERS, check_installed, open_trackers
from workbench.watch.report import Report

SITECUSTOMIZE = '''"""Written by `python -m workbench watch`: watch every Hugging Face model this process builds."""
try:
    from workbench.cli.watch_child import install as _install
    _install()
except Exception as _exc:  # never break the user's script
    import sys as _sys
    print(f"workbench watch: not watching this process ({type(_exc).__name__}: {_exc})", file=_sys.stderr)
'''


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, help="folder for report.json and report.html (default: runs/watch-<timestamp>)")
    parser.add_argument("--deep", action="store_true", help="also the gradient checks (S4, P6, P14, P12's re-scoring): costlier")
    parser.add_argument("--report-to", nargs="+", choices=("none", *TRACKERS), default=["none"], metavar="TRACKER",
                        help="tensorboard (into --out), trackio, wandb (several at once) or none: the report's counters "
                             "as scalars; trackio and wandb need the trackers extra")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command that trains, e.g. -- python my_train.py --lr 1e-5")


def child_environment(out: Path, deep: bool, site: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([site] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env[OUT_VARIABLE], env[DEEP_VARIABLE] = str(out.resolve()), "1" if deep else "0"
    return env


def collect(out: Path) -> Report:
    """Merge every process's part into one report (``observed["processes"]``: how many built a model)."""
    parts = sorted(glob.glob(str(out / "parts" / "*.json")))
    reports = [Report.from_dict(json.loads(Path(p).read_text())) for p in parts]
    report = Report.merge(reports)
    report.observed["processes"] = len(reports)
    return report


def run_watched(command: list[str], out: Path, deep: bool = False) -> int:
    """Run ``command`` watched; returns its exit status (negative: killed by that signal)."""
    with tempfile.TemporaryDirectory(prefix="workbench-watch-site-") as site:
        Path(site, "sitecustomize.py").write_text(SITECUSTOMIZE)
        process = subprocess.Popen(command, env=child_environment(out, deep, site))
        forward = lambda signum, frame: process.send_signal(signum)  # noqa: E731
        previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),  # the terminal's Ctrl-C reaches the child
                    signal.SIGTERM: signal.signal(signal.SIGTERM, forward)}
        try:
            return process.wait()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def main(args) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("error: no command to watch; give it after --, e.g. python -m workbench watch -- python my_train.py", file=sys.stderr)
        return 2
    out = Path(args.out or Path("runs") / time.strftime("watch-%Y%m%d-%H%M%S"))
    try:  # a missing tracker package is bad input, said before the script runs
        names = check_installed(args.report_to)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    for stale in glob.glob(str(out / "parts" / "*.json")):  # an earlier run into the same folder
        os.remove(stale)
    try:
        status = run_watched(command, out, deep=args.deep)
    except (FileNotFoundError, PermissionError) as exc:
        print(f"error: cannot start {command[0]!r}: {exc}; give a command on PATH or a path, e.g. -- python my_train.py",
              file=sys.stderr)
        return 2
    report = collect(out)
    json_path, html_path = report.write(out, title=f"workbench.watch: {' '.join(command)}")
    print(report)
    if not report.observed["processes"]:
        print("note: the script built no Hugging Face model that could be watched (transformers' PreTrainedModel), or its "
              "interpreter cannot import workbench", file=sys.stderr)
    print(f"report: {html_path} ({json_path})")
    if names:
        with open_trackers(names, output_dir=str(out), run_name=f"watch-{out.name}") as trackers:
            trackers.log(report.scalars("watch/"), step=0)
            for where in trackers.where:
                print(f"logged the report's counters to {where}")
    if status in (-signal.SIGINT, 128 + signal.SIGINT):
        print("interrupted: the report covers what ran", file=sys.stderr)
        return 130
    if status != 0:
        print(f"the script failed (exit status {status}); the report covers what ran", file=sys.stderr)
        return 3
    return 1 if report.errors else 0
