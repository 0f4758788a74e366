"""``python -m tuner.engines.emulated serve MODEL <vllm serve flags>`` (see :mod:`.cli`)."""

from tuner.engines.emulated.cli import main

raise SystemExit(main())
