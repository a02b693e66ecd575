"""Block pool with a hash-addressed prefix cache and LRU eviction of unreferenced blocks.

Mirrors vLLM's KV block manager at the level that matters for routing: a block that holds a
full prompt block is registered under its chained hash; running requests hold references; a block
whose reference count falls to zero stays cached (evictable) and is evicted least recently
released first, a request's deepest block before its root.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol


class BlockListener(Protocol):
    """Optional observer of cache contents (the emulator's KV-event publisher)."""

    def block_stored(self, block_hash: int) -> None: ...

    def blocks_removed(self, block_hashes: Sequence[int]) -> None: ...


class BlockPool:
    """``capacity_blocks`` KV blocks: free, cached-and-evictable, or referenced."""

    def __init__(self, capacity_blocks: int, listener: BlockListener | None = None) -> None:
        self.capacity_blocks = capacity_blocks
        self._listener = listener
        self._refcount: dict[int, int] = {}  # registered hash -> references
        self._evictable: OrderedDict[int, None] = OrderedDict()  # refcount 0, oldest first
        self._free_plain = capacity_blocks  # never-registered free blocks
        self.referenced_blocks = 0  # distinct physical blocks held by requests

    @property
    def cached_blocks(self) -> int:
        return len(self._refcount)

    def cached_prefix(self, block_hashes: Sequence[int]) -> int:
        """Number of leading ``block_hashes`` that are cached (referenced or evictable)."""
        refcount = self._refcount
        n = 0
        for h in block_hashes:
            if h not in refcount:
                break
            n += 1
        return n

    def available_for(self, hit_hashes: Sequence[int]) -> int:
        """Blocks that could be handed out if ``hit_hashes`` were referenced first."""
        refcount = self._refcount
        pinned = sum(1 for h in hit_hashes if refcount[h] == 0)
        return self._free_plain + len(self._evictable) - pinned

    def acquire(self, hit_hashes: Sequence[int], new_blocks: int) -> None:
        """Reference ``hit_hashes`` and take ``new_blocks`` anonymous blocks (caller checked)."""
        refcount = self._refcount
        evictable = self._evictable
        revived = 0
        for h in hit_hashes:
            count = refcount[h]
            if count == 0:
                del evictable[h]
                revived += 1
            refcount[h] = count + 1
        take_plain = min(self._free_plain, new_blocks)
        self._free_plain -= take_plain
        victims = [evictable.popitem(last=False)[0] for _ in range(new_blocks - take_plain)]
        for victim in victims:
            del refcount[victim]
        if victims and self._listener is not None:
            self._listener.blocks_removed(victims)
        self.referenced_blocks += revived + new_blocks

    def register(self, block_hash: int) -> bool:
        """Turn one of the caller's anonymous blocks into the cached block ``block_hash``.

        Returns False (the block stays anonymous) when the hash is already cached, e.g. computed
        by a concurrent request.
        """
        if block_hash in self._refcount:
            return False
        self._refcount[block_hash] = 1
        if self._listener is not None:
            self._listener.block_stored(block_hash)
        return True

    def register_many(self, block_hashes: Sequence[int]) -> list[int]:
        """``register`` each hash in turn; return the ones that were registered."""
        refcount = self._refcount
        out = []
        for h in block_hashes:
            if h not in refcount:
                refcount[h] = 1
                out.append(h)
        if self._listener is not None:
            for h in out:
                self._listener.block_stored(h)
        return out

    def release(self, held_hashes: Sequence[int], anonymous_blocks: int) -> None:
        """Drop a request's references: deepest block becomes evictable first."""
        refcount = self._refcount
        evictable = self._evictable
        unreferenced = 0
        for h in reversed(held_hashes):
            count = refcount[h] - 1
            refcount[h] = count
            if count == 0:
                evictable[h] = None
                unreferenced += 1
        self._free_plain += anonymous_blocks
        self.referenced_blocks -= unreferenced + anonymous_blocks

    def reset(self) -> bool:
        """Forget every cached block (vLLM's prefix-cache reset, done by ``/sleep``); refused
        (False, nothing changes) while a request holds a block, as vLLM refuses it."""
        if self.referenced_blocks:
            return False
        dropped = list(self._evictable)
        self._evictable.clear()
        self._refcount.clear()
        self._free_plain = self.capacity_blocks
        if dropped and self._listener is not None:
            self._listener.blocks_removed(dropped)
        return True

    def check_invariants(self) -> None:
        """Raise AssertionError if the accounting is inconsistent (tests)."""
        assert self._free_plain >= 0
        assert all(c >= 0 for c in self._refcount.values())
        assert all(self._refcount[h] == 0 for h in self._evictable)
        zero = sum(1 for c in self._refcount.values() if c == 0)
        assert zero == len(self._evictable)
        registered_referenced = len(self._refcount) - zero
        assert registered_referenced <= self.referenced_blocks
        total = self._free_plain + len(self._evictable) + self.referenced_blocks
        assert total == self.capacity_blocks, (total, self.capacity_blocks)
