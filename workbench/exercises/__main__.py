"""``python -m workbench.exercises OUT.json``: grade every reference solution and write the grades as JSON.

The batch runner starts this beside the notebooks (``workbench.catalogue.batch``), so that the run report's
Exercises section proves the graders without making the run longer.
"""

import json
import sys
from pathlib import Path

from workbench.exercises.grading import grade_solutions


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m workbench.exercises OUT.json", file=sys.stderr)
        return 2
    grades = [g.to_dict() for g in grade_solutions()]
    Path(argv[0]).write_text(json.dumps(grades, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
