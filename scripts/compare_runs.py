"""Compare two catalogue runs notebook by notebook: verdicts, headlines, metric keys and numbers.

    python scripts/compare_runs.py runs/before runs/after [--rtol 1e-6] [--atol 1e-9]

Used to check that a change meant to leave what users see alone (a restructuring, a speed path) does:
same notebooks, same ``reproduced``/``fixed``, same headline, the same ``metrics`` keys, and every number
within the tolerance. Both runs should come from the same machine and parameters (``--smoke`` or not):
across machines floats differ in their last bits (docs/CPU_PORTABILITY.md), hence the tolerances.

Exit codes: 0 the same, 1 differences (each printed), 2 bad input (a folder that is not a run).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def read_run(folder: Path) -> dict[str, dict]:
    """``{stem: metrics.json}`` of every notebook folder of a run."""
    if not folder.is_dir():
        raise SystemExit(f"error: {folder} is not a folder; pass the output folder of `python -m workbench run` (exit 2)")
    runs = {}
    for path in sorted(folder.glob("*/metrics.json")):
        runs[path.parent.name] = json.loads(path.read_text())
    if not runs:
        raise SystemExit(f"error: {folder} holds no <notebook>/metrics.json; is it the output folder of a run?")
    return runs


def leaves(value, prefix: str = ""):
    """``(path, leaf)`` pairs of a JSON value, lists indexed."""
    if isinstance(value, dict):
        for key in sorted(value):
            yield from leaves(value[key], f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaves(item, f"{prefix}[{i}]")
    else:
        yield prefix, value


def same_leaf(a, b, rtol: float, atol: float) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, int | float) or not isinstance(b, int | float):
        return a == b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=rtol, abs_tol=atol)


def differences(before: dict, after: dict, rtol: float, atol: float) -> list[str]:
    """Every difference between two runs' results, one line each."""
    lines = []
    for stem in sorted(set(before) | set(after)):
        if stem not in after or stem not in before:
            lines.append(f"{stem}: only in the {'first' if stem in before else 'second'} run")
            continue
        a, b = before[stem], after[stem]
        for key in ("reproduced", "fixed"):
            if a.get(key) != b.get(key):
                lines.append(f"{stem}: {key} {a.get(key)} → {b.get(key)}")
        for part in ("headline", "metrics"):
            la, lb = dict(leaves(a.get(part) or {})), dict(leaves(b.get(part) or {}))
            for path in sorted(set(la) ^ set(lb)):
                lines.append(f"{stem}: {part}.{path} only in the {'first' if path in la else 'second'} run")
            for path in sorted(set(la) & set(lb)):
                if path.startswith("seconds") or path.endswith("seconds") or "wall" in path:
                    continue  # timings differ from run to run
                if not same_leaf(la[path], lb[path], rtol, atol):
                    lines.append(f"{stem}: {part}.{path} {la[path]!r} → {lb[path]!r}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rtol", type=float, default=1e-6, help="relative tolerance for numbers (default 1e-6)")
    parser.add_argument("--atol", type=float, default=1e-9, help="absolute tolerance for numbers (default 1e-9)")
    args = parser.parse_args(argv)
    try:
        before, after = read_run(args.before), read_run(args.after)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    lines = differences(before, after, args.rtol, args.atol)
    print(f"{len(set(before) & set(after))} notebooks compared; {len(lines)} difference(s)")
    for line in lines:
        print("  " + line)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
