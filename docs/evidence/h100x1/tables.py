"""Tables of the 1x H100 study (issue 30: h200x1-tiny's space on the H100 the device lent), rebuilt from the
files scripts/gpu/collect.py writes here.

The tables are the one-GPU study's, shared with the H200 run: ``docs/evidence/h200x1/tables.py`` defines
them, and each reads only the folder it is given (here, this one).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SHARED = Path(__file__).resolve().parent.parent / "h200x1" / "tables.py"
_spec = importlib.util.spec_from_file_location("_evidence_one_gpu_tables", _SHARED)
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)

TABLES = dict(_module.TABLES)
