"""Summarize one ``.ci/run`` on a fresh clone into ``ci.json`` beside this file (docs/ci-timing.md's data).

    git clone <repo> /tmp/ci-clone && cd /tmp/ci-clone
    uptime > /tmp/ci/load_before
    DSV4_JUNIT_DIR=/tmp/ci/junit DSV4_CI=1 bash .ci/run > /tmp/ci/ci.log 2>&1; echo $? > /tmp/ci/rc
    uptime > /tmp/ci/load_after
    .venv/bin/python docs/evidence/ci-timing/collect.py /tmp/ci --commit $(git -C /tmp/ci-clone rev-parse --short HEAD)
                                                           # run in the repository, on the machine CI ran on

Reads ``ci.log`` (``.ci/run`` prints how long setup and the whole run took, ``scripts/test.sh`` how long
its two test lanes took side by side; pytest's ``--durations`` tables and summary lines, one per lane),
``junit/*.xml`` (every test's time, setup + call + teardown, one file per lane; an older run's single
``junit.xml`` is read too) and the load averages. Keeps the totals, the time per test module and per lane,
and the slowest phases: a summary, not the log.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DURATION = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S+)")
SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed).*) in ([\d.]+)s")
LOAD = re.compile(r"load average: ([\d.]+), ([\d.]+), ([\d.]+)")


def _load(path: Path) -> list[float] | None:
    match = LOAD.search(path.read_text()) if path.is_file() else None
    return [float(x) for x in match.groups()] if match else None


def _span(first: Path, last: Path) -> int | None:
    """Seconds between two files' modification times (written just before and just after the run)."""
    if not (first.is_file() and last.is_file()):
        return None
    return round(last.stat().st_mtime - first.stat().st_mtime)


def _counts(text: str) -> dict[str, int]:
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|deselected)", text)}


def _cpu() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "")
    mem_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))
    return {"cpus": os.cpu_count(), "cpu_model": model, "memory_gib": round(mem_kib / 2**20, 1)}


def module_of(classname: str) -> str:
    """The test module of a junit ``classname`` (``tests.unit.test_x`` or ``tests.unit.test_x.TestClass``)."""
    parts = classname.split(".")
    while parts and not parts[-1].startswith("test_"):  # a test class: its module is above it
        parts.pop()
    return "/".join(parts) + ".py"


def collect(folder: Path) -> dict[str, Any]:
    log = (folder / "ci.log").read_text(errors="replace")
    setup = re.search(r"^setup took (\d+) s", log, re.M)
    total = re.search(r"^ci took (\d+) s", log, re.M)
    summary = [m for m in (SUMMARY.match(line) for line in log.splitlines()) if m and "passed" in m.group(1)]
    lanes = re.search(r"^tests took (\d+) s", log, re.M)
    slowest = [{"s": float(m.group(1)), "phase": m.group(2), "test": m.group(3)}
               for m in (DURATION.match(line) for line in log.splitlines()) if m]
    modules: dict[str, float] = collections.defaultdict(float)
    tests: dict[str, int] = collections.Counter()
    lane_s: dict[str, float] = {}
    files = sorted((folder / "junit").glob("*.xml")) or [folder / "junit.xml"]
    lane_of: dict[str, str] = {}
    cases = []
    for path in files:
        root = ET.parse(path).getroot()  # noqa: S314 (pytest's own output)
        lane_cases = list(root.iter("testcase"))
        lane_s[path.stem] = round(sum(float(c.get("time", 0.0)) for c in lane_cases), 1)
        cases += [(path.stem, c) for c in lane_cases]
    for lane, case in cases:
        name = module_of(case.get("classname", ""))
        if name.startswith("tests/unit/"):
            name = "tests/unit (all)"
        modules[name] += float(case.get("time", 0.0))
        tests[name] += 1
        lane_of[name] = lane if name not in lane_of or lane_of[name] == lane else "both"
    rc_file = folder / "rc"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=folder / "clone" if (folder / "clone").is_dir() else None, check=False).stdout.strip()
    return {"what": ".ci/run on a fresh clone: scripts/setup.sh, then scripts/test.sh under DSV4_CI=1",
            "commit": commit, "machine": _cpu(),
            "load_average_before": _load(folder / "load_before"), "load_average_after": _load(folder / "load_after"),
            "exit_code": int(rc_file.read_text().strip()) if rc_file.is_file() else None,
            "setup_s": int(setup.group(1)) if setup else None,
            # a failing run stops before `.ci/run` prints its total: then the files written around it
            "ci_s": int(total.group(1)) if total else _span(folder / "load_before", folder / "rc"),
            # the lanes run side by side: the tests' wall time is test.sh's, each lane's is the sum of its tests
            "pytest_s": float(lanes.group(1)) if lanes else (float(summary[-1].group(2)) if summary else None),
            "lanes_s": lane_s,
            # scripts/test.sh runs ruff and mypy beside the tests and prints their exit code with the lanes'
            "lint_beside_tests": bool(re.search(r"^tests took \d+ s \(.*ruff and mypy exit", log, re.M)),
            # each lane deselects the other's tests: a deselected count says nothing of the run
            "pytest_counts": {k: n for k, n in sum((collections.Counter(_counts(m.group(1))) for m in summary),
                                                   collections.Counter()).items() if k != "deselected"},
            "modules": sorted(({"module": m, "lane": lane_of[m], "tests": tests[m], "s": round(s, 1)}
                               for m, s in modules.items()),
                              key=lambda r: -float(r["s"])),
            "slowest": slowest}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="holds ci.log, junit/*.xml, rc, load_before, load_after")
    parser.add_argument("--commit", help="the commit the clone ran (default: the clone's HEAD if folder/clone)")
    args = parser.parse_args()
    data = collect(args.folder)
    if args.commit:
        data["commit"] = args.commit
    (HERE / "ci.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {(HERE / 'ci.json').relative_to(HERE.parents[2])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
