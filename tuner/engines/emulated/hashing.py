"""A hash that is the same in every process (Python's ``hash`` of a ``str`` is salted per process)."""

from __future__ import annotations

import hashlib

__all__ = ["stable_hash"]


def stable_hash(*parts: object) -> int:
    """64-bit hash of the parts' ``repr``: equal parts give equal hashes on every run and machine."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")
