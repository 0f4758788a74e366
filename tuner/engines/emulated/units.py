"""The emulator's units: time scale and multiplicity (``docs/emulator.md``, "Units", is the one definition).

Two settings:

- ``time_scale`` s: virtual (node) seconds per real second. A step the model prices at 100 ms
  reaches the client after 100 / s ms. Start-up may use its own ``startup_time_scale``.
- ``multiplicity`` M: one HTTP request stands for M identical virtual requests. They occupy M
  batch slots, M × their tokens of KV, and count M times in every ``/metrics`` counter and
  histogram. The stream carries one of them: its ``usage`` is one request's, its chunks one
  request's tokens.

``/metrics`` and the start-up log speak node units (virtual seconds, virtual requests and tokens),
as a real node's would. The class is the load generator's (:class:`tuner.load.units.Units`): the
server states its units with it, and the tuner's client converts what it measured with the same
object, in one place.
"""

from __future__ import annotations

from tuner.load.units import Units

__all__ = ["Units"]
