"""Write the "Does it matter?" table of a catalogue run into docs/LEARNING.md, never by hand.

    python scripts/learning_report.py runs/<stamp> [--doc docs/LEARNING.md]

Reads each notebook's ``metrics.json`` under ``RUN_DIR/<notebook>/`` (the layout of ``python -m
workbench run``), builds one row per predicted training consequence (``metrics["prediction"]``, rows
from ``workbench.catalogue.consequences``: effect ± s.e., minimum detectable effect, verdict), and
writes them as a markdown table between the markers

    <!-- learning-report: begin -->
    <!-- learning-report: end -->

replacing what was there (the section is appended to the document when it has no markers), with
the run's date, mode (full or smoke), seeds and environment from ``RUN_DIR/summary.json`` when the run
wrote one. Its prose is wrapped at ``WIDTH`` characters (the table's rows are not: a row is one line).
Everything outside the markers is left as it is.

Exit codes: 0 written; 2 bad input (a folder that is not a run, a run with no prediction recorded, a
document that is missing or whose markers are broken), with a message naming the path and the fix.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.catalogue.consequences import consequence_rows, markdown_table, tally  # noqa: E402
from workbench.core.paths import REPO_ROOT  # noqa: E402

BEGIN = "<!-- learning-report: begin -->"
END = "<!-- learning-report: end -->"
WIDTH = 120  # the docs' prose lines stay under 160 characters; tables are exempt


class InputProblem(Exception):
    """Bad input: the message names the path and the fix (exit code 2)."""


def read_run(run: Path) -> tuple[dict[str, dict], dict]:
    """``({notebook: metrics.json payload}, summary.json or {})`` of a catalogue run folder."""
    if not run.is_dir():
        raise InputProblem(f"{run}: no such folder; pass the output folder of `python -m workbench run` (runs/<stamp>)")
    payloads = {}
    for path in sorted(run.glob("*/metrics.json")):
        try:
            payloads[path.parent.name] = json.loads(path.read_text())
        except ValueError as exc:
            raise InputProblem(f"{path}: not valid JSON ({exc}); run that notebook again "
                               f"(`python -m workbench run {path.parent.name} --out {run} --resume`)") from exc
    if not payloads:
        raise InputProblem(f"{run} holds no <notebook>/metrics.json; pass the output folder of a finished "
                           "`python -m workbench run` (runs/<stamp>)")
    summary_path = run / "summary.json"
    try:
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    except ValueError as exc:
        raise InputProblem(f"{summary_path}: not valid JSON ({exc}); remove it to write the table without the run's "
                           "date, mode and environment") from exc
    return payloads, summary


def _seeds(rows: list[dict], payloads: dict[str, dict]) -> str:
    counts = sorted({r["seeds"] for r in rows if isinstance(r["seeds"], int)})
    if not counts:  # the predictions did not say: the notebooks' parameters
        counts = sorted({len(p["parameters"]["seeds"]) for p in payloads.values()
                         if isinstance((p.get("parameters") or {}).get("seeds"), list)})
    return ", ".join(map(str, counts)) if counts else "not recorded"


def _wrap(text: str, indent: str = "") -> str:
    """``text`` as lines of at most ``WIDTH`` characters, continuation lines indented by ``indent``."""
    return textwrap.fill(text, WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)


def section(run: Path, payloads: dict[str, dict], summary: dict) -> str:
    """The marked section: where the numbers come from, the tally, the table, how to read it."""
    rows = consequence_rows(payloads)
    if not rows:
        raise InputProblem(f"{run}: none of its {len(payloads)} notebooks records metrics['prediction']; run the "
                           "training notebooks of a catalogue that records it (statistics.prediction), then this script")
    if summary.get("finished"):
        date = str(summary["finished"]).replace("T", " ")
    else:
        newest = max((run / stem / "metrics.json").stat().st_mtime for stem in payloads)
        date = f"{datetime.fromtimestamp(newest):%Y-%m-%d %H:%M} (newest metrics.json; the run wrote no finish time)"
    mode = ("smoke" if summary["smoke"] else "full") if "smoke" in summary else "not recorded (no summary.json)"
    environment = summary.get("environment") or {}
    env = " · ".join(f"{k} {v}" for k, v in environment.items()) if environment else "not recorded (no summary.json)"
    return "\n".join([
        BEGIN,
        "## Does it matter? (generated)",
        "",
        _wrap(f"Written by `python scripts/learning_report.py runs/{run.name}` from that catalogue run; do not edit by hand."),
        "",
        _wrap(f"- run finished: {date}", "  "),
        _wrap(f"- mode: {mode}; seeds per training notebook: {_seeds(rows, payloads)}", "  "),
        _wrap(f"- environment: {env}", "  "),
        "",
        _wrap(f"{tally(rows)}. Effect = bug − fix over seeds ± its standard error; it is larger than seed noise when "
              "|effect| > the 95 % t threshold × s.e., and that product is the minimum detectable effect (MDE): a null "
              "reads \"no effect > MDE\", the largest effect these seeds rule out."),
        "",
        markdown_table(rows),
        END,
    ])


def replace_section(text: str, new: str, doc: Path) -> str:
    """``text`` with the marked section replaced by ``new`` (appended when there are no markers)."""
    begins, ends = text.count(BEGIN), text.count(END)
    if begins == ends == 0:
        return text.rstrip("\n") + "\n\n" + new + "\n"
    if begins != 1 or ends != 1 or text.index(END) < text.index(BEGIN):
        first = min(text.index(marker) for marker in (BEGIN, END) if marker in text)
        line = text[:first].count("\n") + 1
        raise InputProblem(f"{doc}:{line}: the markers are broken ({begins} begin, {ends} end, in this order); keep one "
                           f"'{BEGIN}' followed by one '{END}', or remove both to append the section")
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + new + text[stop:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="the output folder of `python -m workbench run` (runs/<stamp>)")
    parser.add_argument("--doc", type=Path, default=REPO_ROOT / "docs" / "LEARNING.md", help="the document to update")
    args = parser.parse_args(argv)
    try:
        payloads, summary = read_run(args.run)
        new = section(args.run, payloads, summary)
        if not args.doc.is_file():
            raise InputProblem(f"{args.doc}: no such file; pass --doc with an existing document (default docs/LEARNING.md)")
        args.doc.write_text(replace_section(args.doc.read_text(), new, args.doc))
    except InputProblem as problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    print(f"{args.doc}: 'Does it matter?' section written from {args.run} ({len(consequence_rows(payloads))} consequences)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
