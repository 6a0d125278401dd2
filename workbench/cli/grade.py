"""``python -m workbench grade SUBMISSIONS… --out DIR``: grade submitted exercise notebooks (for teachers).

Each submission (an exercise notebook or a folder of them) is executed headless in the sandbox and graded;
``DIR`` receives ``grades.csv`` and one feedback page per submission (``workbench.exercises.submissions``).
Exit codes: 0 graded (whatever the scores), 2 bad input (a missing file, not a notebook, an unknown exercise).
"""

from __future__ import annotations

import sys
from pathlib import Path

from workbench.core.errors import InputError
from workbench.exercises.grading import DEFAULT_TIME_LIMIT_S


def add_arguments(parser) -> None:
    parser.add_argument("submissions", nargs="+", metavar="SUBMISSION",
                        help="an exercise notebook (.ipynb) or a folder of them (one learner's work)")
    parser.add_argument("--out", required=True, help="folder for grades.csv and the feedback pages")
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S, metavar="SECONDS",
                        help=f"time limit per case (default {DEFAULT_TIME_LIMIT_S:g})")


def main(args) -> int:
    from workbench.exercises.submissions import grade_submissions

    if args.time_limit <= 0:
        print(f"error: --time-limit {args.time_limit:g}: give a positive number of seconds (e.g. 10)", file=sys.stderr)
        return 2
    try:
        graded = grade_submissions([Path(p) for p in args.submissions], Path(args.out), time_limit_s=args.time_limit)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(graded)} notebook(s) graded: {Path(args.out) / 'grades.csv'}")
    return 0
