"""CI runs the target night (issue #14 item 7): ``scripts/ci_night.py`` on the emulated node.

``dsv4-tune --hw gh200x4 --objective throughput``, ``--hw h200x8`` and ``--hw h200x8 --objective agent``,
each through the real command line with ``--engine emulated`` and the profile's default gates. The
script checks every night (the gates on and passed, each ladder through its knee, the winner confirmed,
exported and beating the baselines, the emulator's trap refused by a gate and never exported) and
exits 1 naming what failed; this test runs it and shows its verdicts when it fails. The three nights
run side by side.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NIGHTS = ("gh200x4-throughput", "h200x8-throughput", "h200x8-agent")


@pytest.mark.slow
def test_the_target_nights_pass_on_the_emulated_node(tmp_path: Path) -> None:
    out = tmp_path / "nights"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "ci_night.py"), "--out", str(out), "--jobs", "3",
                           "--nights", ",".join(NIGHTS)],
                          cwd=REPO, capture_output=True, text=True, check=False)
    checks = json.loads((out / "checks.json").read_text()) if (out / "checks.json").is_file() else []
    assert done.returncode == 0, (done.stdout[-6000:] + done.stderr[-4000:])
    assert {c["night"] for c in checks} == set(NIGHTS)
    for night in checks:
        assert not night["failures"], night
        for name in ("default gates on", "gates passed", "winner confirmed", "winner exported",
                     "beats the baselines", "trap refused by a gate", "no trap exported"):
            assert night["checks"][name].startswith("ok"), (night["night"], name, night["checks"][name])
