"""The ``dsv4-tune`` command line.

    main.py       the parser, the commands (run, resume, export, report, status, list, plan, demo-model)
    scaleout.py   ``worker`` and ``run --backend ray``
    args.py       reading values (durations, SLOs, guard lists, counts); the study record of ``run``

``dsv4-tune`` is :func:`tuner.cli.main.main`; ``python -m tuner.cli`` runs the same.
"""

from __future__ import annotations

from tuner.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
