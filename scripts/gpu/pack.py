#!/usr/bin/env python3
"""Pack a study folder into one ``.tar.gz`` under a size limit, for the device tool's ``$OUT``.

What comes back from the H200 machine is at most 8 files of 16 MiB each. The study folder (its
``study.db``, every trial's records and server log, the exported ``best/``, ``verify/``) is packed
whole when it fits. When it does not, the per-request records are dropped from every ``load.json``
(the step summaries, server counters, gauges, power and client figures stay) and ``PACKED.txt``
says so; then the server logs are cut to their last 200 kB. Stdlib only: it runs on the machine.

    python3 scripts/gpu/pack.py STUDY_DIR OUT.tar.gz [--max-mib 15]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tarfile
import tempfile
from pathlib import Path

LOG_KEEP_BYTES = 200_000


def _tar(src: Path, out: Path) -> int:
    with tarfile.open(out, "w:gz", compresslevel=6) as tar:
        tar.add(src, arcname=src.name)
    return out.stat().st_size


def _drop_requests(root: Path) -> int:
    dropped = 0
    for path in root.rglob("load.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for repeat in data.get("repeats", []):
            for step in repeat.get("steps", []):
                dropped += len(step.pop("requests", []) or [])
        path.write_text(json.dumps(data))
    return dropped


def _cut_logs(root: Path) -> int:
    cut = 0
    for path in root.rglob("server.log"):
        size = path.stat().st_size
        if size > LOG_KEEP_BYTES:
            with path.open("rb") as fh:
                fh.seek(size - LOG_KEEP_BYTES)
                tail = fh.read()
            path.write_bytes(b"[... cut by pack.py: the first %d bytes ...]\n" % (size - LOG_KEEP_BYTES) + tail)
            cut += 1
    return cut


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-mib", type=float, default=15.0)
    args = parser.parse_args()
    limit = int(args.max_mib * 1024 * 1024)
    size = _tar(args.study, args.out)
    if size <= limit:
        print(f"packed {args.study.name} whole: {size / 1e6:.1f} MB")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / args.study.name
        shutil.copytree(args.study, copy, ignore=shutil.ignore_patterns(".lock*", "*.db-journal"))
        notes = [f"{args.study.name} packed at {size / 1e6:.1f} MB whole, over {limit / 1e6:.1f} MB:"]
        notes.append(f"- per-request records dropped from load.json: {_drop_requests(copy)} requests")
        (copy / "PACKED.txt").write_text("\n".join(notes) + "\n")
        size = _tar(copy, args.out)
        if size > limit:
            notes.append(f"- server.log files cut to their last {LOG_KEEP_BYTES} bytes: {_cut_logs(copy)}")
            (copy / "PACKED.txt").write_text("\n".join(notes) + "\n")
            size = _tar(copy, args.out)
    print("\n".join(notes) + f"\npacked: {size / 1e6:.1f} MB")
    return 0 if size <= limit else 1


if __name__ == "__main__":
    raise SystemExit(main())
