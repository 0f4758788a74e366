"""The suite's own layout: pytest's default (rootdir-based) import mode needs test module names unique.

Two ``test_x.py`` in different folders without packages collect as the same module ``test_x``; pytest
then stops at collection ("import file mismatch"), on a clean checkout only (no stale ``__pycache__``
hides it). That is how a CI run failed; this catches it before one does.
"""

from __future__ import annotations

import collections
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_names_are_unique() -> None:
    names = collections.defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if not (path.parent / "__init__.py").exists():
            names[path.name].append(str(path.relative_to(TESTS)))
    duplicates = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert not duplicates, f"rename one of each: {duplicates}"
