"""A background poll that lives as long as a ``with`` block: the gauge sampler, the health watch."""

from __future__ import annotations

import threading
from typing import TypeVar

__all__ = ["Poller"]

P = TypeVar("P", bound="Poller")


class Poller:
    """Calls :meth:`poll` every ``interval_s`` seconds in a daemon thread, inside a ``with`` block.

    :meth:`poll` returns False to stop early. Leaving the block stops the thread and waits for it
    (at most ``join_timeout_s``).
    """

    def __init__(self, name: str, interval_s: float, *, join_timeout_s: float) -> None:
        self.interval_s = interval_s
        self._join_timeout_s = join_timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def poll(self) -> bool:
        """One poll; False ends the polling."""
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.poll():
                return

    def __enter__(self: P) -> P:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self._join_timeout_s)
