"""The last line of CI: which peer probes and which browser test really ran, from pytest's JUnit XML.

``python scripts/ci_summary.py JUNIT.xml [PEERS_NOTE]`` prints e.g.
``CI checked: peer probes run (14) | skipped (3: no environment trl-0.11.4 (run `make peers`)); browser test run (1)``.
Derived from evidence only: a test counts as run when the XML holds it without a ``<skipped>``
element, as skipped with the first skip message; ``PEERS_NOTE`` (e.g. "make peers failed, exit 2")
is added to the peer part. Standard library only; a missing XML says so instead of guessing.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

GROUPS = {"peer probes": ("test_peer_lab", "test_peer_envs"), "browser test": ("test_browser",)}


def outcomes(junit: Path) -> dict[str, tuple[int, list[str]]]:
    """``{group: (tests run, skip messages)}`` from a JUnit XML file."""
    result = {group: (0, []) for group in GROUPS}
    for case in ET.parse(junit).getroot().iter("testcase"):
        where = f"{case.get('classname', '')}.{case.get('file', '')}"
        for group, modules in GROUPS.items():
            if any(m in where for m in modules):
                run, skips = result[group]
                skipped = case.find("skipped")
                if skipped is None:
                    result[group] = (run + 1, skips)
                else:
                    skips.append((skipped.get("message") or "no reason given").removeprefix("Skipped: ").strip())
    return result


def part(group: str, run: int, skips: list[str], note: str = "") -> str:
    if not run and not skips:
        text = f"{group} not selected"
    else:
        text = f"{group} run ({run})" + (f" | skipped ({len(skips)}: {skips[0][:160]})" if skips else "")
    return text + (f" [{note}]" if note else "")


def summary(junit: Path, peers_note: str = "") -> str:
    if not junit.is_file():
        return f"CI checked: unknown — pytest wrote no {junit.name} (the test step did not get that far)"
    found = outcomes(junit)
    return "CI checked: " + "; ".join(part(g, *found[g], peers_note if g == "peer probes" else "") for g in GROUPS)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else ""))
