"""The GPU tier's counts from scripts/device/i39.sh's folder: one row per pytest run (phases.txt: label, exit status,
seconds; gpu-tier-LABEL.xml: JUnit), the failed tests, and the seconds per file (for the next split).

    python3 scripts/device/tier_table.py OUT
    python3 scripts/device/tier_table.py --failed XML   # the pytest ids of its failed tests, one a line (to run again)
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def _split(classname: str) -> tuple[list[str], int]:
    """A JUnit classname's dotted parts and the place of its test module (tests.harness.test_x or
    tests.harness.test_x.TestClass: test_x; the last part when none is named test_*)."""
    parts = classname.split(".")
    return parts, next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)


def _module(classname: str) -> str:
    parts, k = _split(classname)
    return parts[k]


def _failed(case: ET.Element) -> bool:
    return case.find("failure") is not None or case.find("error") is not None


def node_id(classname: str, name: str) -> str:
    """The pytest id of a JUnit test case: tests.agent.test_x + t -> tests/agent/test_x.py::t, and
    tests.agent.test_x.TestK + t -> tests/agent/test_x.py::TestK::t."""
    parts, k = _split(classname)
    return "::".join(["/".join(parts[:k + 1]) + ".py", *parts[k + 1:], name])


def failed_ids(xml: Path) -> list[str]:
    """The pytest ids of the failed or errored tests of a JUnit file (none when it is missing or unreadable)."""
    try:
        root = ET.parse(xml).getroot()
    except (OSError, ET.ParseError):
        return []
    return [node_id(c.get("classname", ""), c.get("name", "")) for c in root.iter("testcase")
            if c.get("classname") and _failed(c)]


def main(out: Path) -> int:
    per_file: dict[str, float] = defaultdict(float)
    failed: list[str] = []
    print("\n| GPU tier | items | passed | failed | errors | skipped | seconds | pytest exit |")
    print("|---|---|---|---|---|---|---|---|")
    for line in (out / "phases.txt").read_text().splitlines():
        label, rc, secs = line.split()
        try:
            root = ET.parse(out / f"gpu-tier-{label}.xml").getroot()
        except (OSError, ET.ParseError):
            print(f"| {label} | no JUnit XML: see gpu-tier-{label}.log | | | | | {secs} | {rc} |")
            continue
        n = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
        for suite in root.iter("testsuite"):
            for k in n:
                n[k] += int(suite.get(k, 0))
            for case in suite.iter("testcase"):
                per_file[_module(case.get("classname", "?"))] += float(case.get("time", 0))
                if _failed(case):
                    failed.append(f"{case.get('classname')}::{case.get('name')}")
        passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
        stopped = " (stopped at its time limit)" if rc in ("124", "130", "2") and not n["failures"] + n["errors"] else ""
        print(f"| {label} | {n['tests']} | {passed} | {n['failures']} | {n['errors']} | {n['skipped']} | {secs} | "
              f"{rc}{stopped} |")
    for f in failed[:60]:
        print(f"FAILED {f}")
    print("seconds per file: " + ", ".join(f"{k} {v:.0f}"
                                         for k, v in sorted(per_file.items(), key=lambda kv: -kv[1])))
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--failed":
        ids = failed_ids(Path(args[1]))
        if ids:  # no line at all when none: an empty line would reach pytest as "", the whole tests/ folder
            print("\n".join(ids))
        sys.exit(0)
    if len(args) != 1 or not (Path(args[0]) / "phases.txt").is_file():
        sys.exit(f"usage: tier_table.py OUT (a folder with i39.sh's phases.txt) | --failed XML; got {' '.join(args)!r}")
    sys.exit(main(Path(args[0])))
