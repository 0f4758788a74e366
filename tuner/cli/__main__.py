"""``python -m tuner.cli``: the same as ``dsv4-tune``."""

from __future__ import annotations

import sys

from tuner.cli.main import main

sys.exit(main())
