"""One DP engine's KV blocks and its prefix cache, as vLLM v1 keeps them.

Blocks are counted, not stored. A block that holds a full, hashed block of tokens stays in the
cache after its request lets go of it ("evictable": free for allocation, reusable on a hit) until an
allocation needs the room; eviction takes the least recently freed first. The hash of block ``i``
chains the hash of block ``i − 1`` with the block's token ids, so a hit is always a common prefix.
Usage, as vLLM's ``kv_cache_usage_perc``, is the share of blocks held by running requests
(evictable cached blocks count as free).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

__all__ = ["KvPool", "chain_hashes"]


def chain_hashes(token_ids: Sequence[int], block_size: int, parent: int = 0, start_block: int = 0) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (a trailing partial block has none)."""
    out: list[int] = []
    prev = parent
    full = len(token_ids) // block_size
    for i in range(full):
        prev = hash((prev, start_block + i, tuple(token_ids[i * block_size:(i + 1) * block_size])))
        out.append(prev)
    return out


class KvPool:
    """Block accounting of one engine (see the module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, *, caching: bool) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"a KV pool needs blocks: {num_blocks} × {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.used = 0
        self._refs: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()

    @property
    def free(self) -> int:
        """Blocks an allocation may take (evictable cached blocks included)."""
        return self.num_blocks - self.used

    @property
    def usage(self) -> float:
        return self.used / self.num_blocks

    @property
    def cached_blocks(self) -> int:
        return len(self._refs) + len(self._evictable)

    def lookup(self, hashes: Iterable[int]) -> int:
        """How many leading blocks of ``hashes`` the cache holds."""
        if not self.caching:
            return 0
        n = 0
        for h in hashes:
            if h not in self._refs and h not in self._evictable:
                break
            n += 1
        return n

    def evictable_among(self, hashes: Iterable[int]) -> int:
        """How many of ``hashes`` sit in the cache unreferenced (acquiring them takes free blocks)."""
        return sum(1 for h in hashes if h in self._evictable)

    def acquire(self, hashes: Iterable[int]) -> None:
        """Take a reference on cached blocks found by :meth:`lookup` (they stop being evictable)."""
        for h in hashes:
            if h in self._refs:
                self._refs[h] += 1
            else:
                del self._evictable[h]
                self._refs[h] = 1
                self.used += 1

    def allocate(self, blocks: int) -> bool:
        """Take ``blocks`` fresh blocks, evicting cached ones if needed; False when there is no room."""
        if blocks <= 0:
            return True
        if self.free < blocks:
            return False
        self.used += blocks
        overflow = self.used + len(self._evictable) - self.num_blocks
        for _ in range(max(0, overflow)):
            self._evictable.popitem(last=False)
        return True

    def publish(self, block_hash: int) -> bool:
        """Turn one of a request's computed blocks into a cached one (False: that content is cached already)."""
        if not self.caching or block_hash in self._refs or block_hash in self._evictable:
            return False
        self._refs[block_hash] = 1
        return True

    def release(self, anonymous: int, hashed: Iterable[int]) -> None:
        """A request lets go of its blocks; its cached ones become evictable (most recent last)."""
        self.used -= anonymous
        for h in hashed:
            count = self._refs[h] - 1
            if count:
                self._refs[h] = count
            else:
                del self._refs[h]
                self.used -= 1
                self._evictable[h] = None
        if self.used < 0:
            raise AssertionError(f"KV pool released more blocks than it held ({self.used})")
