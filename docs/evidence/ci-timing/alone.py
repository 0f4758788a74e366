"""The real-server lane run alone, and what a fresh ``VLLM_CACHE_ROOT`` costs a launch: ``servers-alone.json``.

Written from one run of the ``server`` tests by themselves on an idle machine (no other lane beside them)::

    pytest -q -m server -p no:cacheprovider --basetemp=DIR/tmp --junitxml=DIR/servers.xml
    python docs/evidence/ci-timing/alone.py DIR --commit SHA

Per module: the sum of its test times (junit). Per launch (each ``server.log`` under the basetemp): the
seconds between vLLM's ``non-default args`` line and its ``Resolved architecture`` line, and whether the
launch had a ``VLLM_CACHE_ROOT`` of its own (a ``modelinfos`` folder beside its log) or vLLM's default.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import re
import statistics
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from collect import module_of  # this folder's junit reading (run as a script: the folder is on sys.path)

STAMP = re.compile(r"\(APIServer pid=\d+\) INFO (\d\d-\d\d \d\d:\d\d:\d\d) \[([a-z_0-9.]+):\d+\]")
OUT = Path(__file__).resolve().parent / "servers-alone.json"


def _gap_s(log: Path) -> float | None:
    """Seconds from ``api_utils`` (the args line) to ``model.py`` (architecture resolved), from the log's stamps."""
    seen: dict[str, datetime.datetime] = {}
    for m in STAMP.finditer(log.read_text(errors="replace")):
        seen.setdefault(m.group(2), datetime.datetime.strptime(m.group(1), "%m-%d %H:%M:%S"))
    if "api_utils.py" not in seen or "model.py" not in seen:
        return None
    return (seen["model.py"] - seen["api_utils.py"]).total_seconds()


def collect(folder: Path, commit: str) -> dict[str, Any]:
    modules: dict[str, float] = collections.defaultdict(float)
    root = ET.parse(folder / "servers.xml").getroot()  # noqa: S314 (pytest's own output)
    for case in root.iter("testcase"):
        modules[module_of(case.get("classname", ""))] += float(case.get("time", 0.0))
    launches: dict[str, list[float]] = {"own cache root": [], "default cache root": []}
    for log in sorted((folder / "tmp").rglob("server.log")):
        gap = _gap_s(log)
        if gap is None:
            continue
        own = any(log.parent.rglob("modelinfos"))
        launches["own cache root" if own else "default cache root"].append(gap)
    return {"what": "the server-marked tests alone on an idle 2-core machine (no other lane)", "commit": commit,
            "lane_s": round(sum(modules.values()), 1),
            "modules": sorted(({"module": m, "s": round(s, 1)} for m, s in modules.items()), key=lambda r: -r["s"]),
            "args_to_architecture_s": {k: {"launches": len(v), "min": min(v) if v else None,
                                           "median": statistics.median(v) if v else None,
                                           "max": max(v) if v else None} for k, v in launches.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--commit", required=True)
    args = parser.parse_args()
    OUT.write_text(json.dumps(collect(args.folder, args.commit), indent=1) + "\n")
    print("wrote", OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
