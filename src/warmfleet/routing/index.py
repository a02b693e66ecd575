"""Prefix indexes: which instance is predicted to hold which chained block hashes.

Both indexes keep a reverse map ``block hash -> bitmask of instances``, so the longest-prefix
match of a key against *every* instance costs O(matched blocks): walk the key's chain while the
mask of instances holding every block so far is non-zero, noting where each instance drops out.

- ``ApproxPrefixIndex`` learns from routing history (``insert`` on every routed request) and
  forgets like the engine does: one LRU per instance whose capacity mirrors the instance's KV
  capacity in blocks. A key's blocks are touched tail first, so the head of a prefix is always
  more recent than its tail and eviction never leaves a hole in a chain.
- ``ExactPrefixIndex`` is fed by engine KV events (``KvEventSink``) and has the same ``match``.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence

from warmfleet.core.types import InstanceId


class _BitIndex:
    """Instance <-> bit allocation and the shared longest-prefix match over ``_owners``."""

    def __init__(self) -> None:
        self._owners: dict[int, int] = {}
        self._bit_of: dict[InstanceId, int] = {}
        self._id_of_bit: dict[int, InstanceId] = {}
        self._free_bits: list[int] = []
        self._next_bit = 0

    def _bit(self, instance_id: InstanceId) -> int:
        bit = self._bit_of.get(instance_id)
        if bit is None:
            bit = self._free_bits.pop() if self._free_bits else self._alloc()
            self._bit_of[instance_id] = bit
            self._id_of_bit[bit] = instance_id
        return bit

    def _alloc(self) -> int:
        bit = self._next_bit
        self._next_bit += 1
        return bit

    def _release(self, instance_id: InstanceId, blocks: Iterable[int]) -> None:
        bit = self._bit_of.pop(instance_id, None)
        if bit is None:
            return
        del self._id_of_bit[bit]
        self._free_bits.append(bit)
        self._drop_bit(bit, blocks)

    def _drop_bit(self, bit: int, blocks: Iterable[int]) -> None:
        owners = self._owners
        clear = ~(1 << bit)
        for h in blocks:
            mask = owners.get(h, 0) & clear
            if mask:
                owners[h] = mask
            else:
                owners.pop(h, None)

    def match(self, block_hashes: Sequence[int]) -> dict[InstanceId, int]:
        """Matched leading blocks per instance (only instances with at least one)."""
        owners = self._owners
        n = len(block_hashes)
        if n == 0:
            return {}
        mask = owners.get(block_hashes[0], 0)
        if not mask:
            return {}
        get = owners.get
        out: dict[InstanceId, int] = {}
        depth = 1
        while depth < n:
            nxt = mask & get(block_hashes[depth], 0)
            if nxt != mask:
                self._record(mask & ~nxt, depth, out)
                mask = nxt
                if not mask:
                    return out
            depth += 1
        self._record(mask, depth, out)
        return out

    def _record(self, bits: int, depth: int, out: dict[InstanceId, int]) -> None:
        id_of_bit = self._id_of_bit
        while bits:
            low = bits & -bits
            out[id_of_bit[low.bit_length() - 1]] = depth
            bits ^= low

    def holders(self, block_hash: int) -> int:
        """Number of instances holding ``block_hash``."""
        return int(self._owners.get(block_hash, 0)).bit_count()

    @property
    def distinct_blocks(self) -> int:
        return len(self._owners)


def _held_prefix(lru: OrderedDict[int, None], hashes: Sequence[int]) -> int:
    """Length of the leading run of ``hashes`` held in ``lru``, assuming held blocks form a
    prefix of the chain (a guess: callers must stay correct when it is wrong)."""
    lo, hi = 0, len(hashes)
    while lo < hi:
        mid = (lo + hi) >> 1
        if hashes[mid] in lru:
            lo = mid + 1
        else:
            hi = mid
    return lo


class ApproxPrefixIndex(_BitIndex):
    """Per-instance LRU of block hashes learnt from routing decisions."""

    def __init__(self, default_capacity_blocks: int) -> None:
        if default_capacity_blocks <= 0:
            raise ValueError("default_capacity_blocks must be > 0")
        super().__init__()
        self.default_capacity_blocks = default_capacity_blocks
        self._lru: dict[InstanceId, OrderedDict[int, None]] = {}
        self._capacity: dict[InstanceId, int] = {}

    def capacity(self, instance_id: InstanceId) -> int:
        return self._capacity.get(instance_id, self.default_capacity_blocks)

    def match(self, block_hashes: Sequence[int]) -> dict[InstanceId, int]:
        """Matched leading blocks per instance, by bisection.

        Each instance's set is prefix-closed along any chain (a block's hash fixes its whole
        prefix, and a chain's head is always touched after its tail), so the mask of holders
        never grows along a key's chain: each run of equal masks is found by binary search, in
        O(changes x log(blocks)) lookups instead of one per matched block.
        """
        n = len(block_hashes)
        if n == 0:
            return {}
        get = self._owners.get
        mask = get(block_hashes[0], 0)
        out: dict[InstanceId, int] = {}
        start = 0
        while mask:
            lo, hi = start + 1, n
            while lo < hi:  # first index whose mask differs from ``mask``
                mid = (lo + hi) >> 1
                if get(block_hashes[mid], 0) == mask:
                    lo = mid + 1
                else:
                    hi = mid
            if lo == n:
                self._record(mask, n, out)
                break
            nxt = get(block_hashes[lo], 0) & mask
            self._record(mask & ~nxt, lo, out)
            start, mask = lo, nxt
        return out

    def set_capacity(self, instance_id: InstanceId, capacity_blocks: int) -> None:
        """Mirror the instance's KV capacity (``<= 0`` means unknown: the default)."""
        cap = capacity_blocks if capacity_blocks > 0 else self.default_capacity_blocks
        if self._capacity.get(instance_id) == cap:
            return
        self._capacity[instance_id] = cap
        lru = self._lru.get(instance_id)
        if lru is not None and len(lru) > cap:
            self._evict(instance_id, lru, cap)

    def occupancy(self, instance_id: InstanceId) -> int:
        lru = self._lru.get(instance_id)
        return len(lru) if lru is not None else 0

    def insert(
        self, instance_id: InstanceId, block_hashes: Sequence[int], held_hint: int = -1
    ) -> None:
        """``instance_id`` now holds the chain ``block_hashes`` (head most recently used).

        ``held_hint``: how many leading blocks the instance is believed to hold already (e.g.
        the decision's ``predicted_cached_blocks``); only a speed hint, a wrong value gives the
        same result. Negative: found by bisection."""
        if not block_hashes:
            return
        cap = self.capacity(instance_id)
        lru = self._lru.get(instance_id)
        if lru is None:
            lru = self._lru[instance_id] = OrderedDict()
        bit = 1 << self._bit(instance_id)
        hashes = block_hashes[:cap] if len(block_hashes) > cap else block_hashes
        # Touch ``reversed(hashes)`` one by one: move a held block to the end, append a new one.
        # A held prefix is usually followed by new blocks only; the split comes from the hint or
        # bisection. The (guessed) new tail is touched in Python, the held head by ``map`` in C.
        # Either part does exactly the per-block touch, so a wrong guess costs time, not order.
        split = min(held_hint, len(hashes)) if held_hint >= 0 else _held_prefix(lru, hashes)
        owners = self._owners
        get = owners.get
        move = lru.move_to_end
        for h in reversed(hashes[split:]):
            if h in lru:
                move(h)
            else:
                lru[h] = None
                owners[h] = get(h, 0) | bit
        head = reversed(hashes[:split])
        while True:
            try:
                deque(map(move, head), maxlen=0)
                break
            except KeyError as missing:  # not held after all: append it, go on with the rest
                h = missing.args[0]
                lru[h] = None
                owners[h] = get(h, 0) | bit
        if len(lru) > cap:
            self._evict(instance_id, lru, cap)

    def _evict(self, instance_id: InstanceId, lru: OrderedDict[int, None], cap: int) -> None:
        owners = self._owners
        clear = ~(1 << self._bit_of[instance_id])
        pop = lru.popitem
        for _ in range(len(lru) - cap):
            h, _none = pop(last=False)
            mask = owners[h] & clear
            if mask:
                owners[h] = mask
            else:
                del owners[h]

    def remove_instance(self, instance_id: InstanceId) -> None:
        lru = self._lru.pop(instance_id, None)
        self._capacity.pop(instance_id, None)
        self._release(instance_id, lru or ())

    def retain(self, instance_ids: Iterable[InstanceId]) -> None:
        """Purge every instance not in ``instance_ids``."""
        keep = set(instance_ids)
        for iid in [i for i in self._lru if i not in keep]:
            self.remove_instance(iid)

    @property
    def instance_ids(self) -> tuple[InstanceId, ...]:
        return tuple(self._lru)

    @property
    def total_blocks(self) -> int:
        return sum(len(lru) for lru in self._lru.values())


class ExactPrefixIndex(_BitIndex):
    """Engine-reported cache contents (``KvEventSink``); instances without events are unknown."""

    def __init__(self) -> None:
        super().__init__()
        self._blocks: dict[InstanceId, set[int]] = {}
        # Where the chains of the hashes it is fed start (set by the feeder; None: any). A key
        # chained from another start (a tenant, an adapter, another model name) names other
        # hashes for the same tokens: this index cannot speak for it.
        self.chain_seed: int | None = None

    def comparable(self, key_chain_seed: int | None) -> bool:
        return self.chain_seed is None or key_chain_seed == self.chain_seed

    def knows(self, instance_id: InstanceId) -> bool:
        return instance_id in self._blocks

    @property
    def known_instances(self) -> tuple[InstanceId, ...]:
        return tuple(self._blocks)

    def occupancy(self, instance_id: InstanceId) -> int:
        return len(self._blocks.get(instance_id, ()))

    def on_blocks_stored(self, instance_id: InstanceId, block_hashes: Sequence[int]) -> None:
        blocks = self._blocks.setdefault(instance_id, set())
        bit = 1 << self._bit(instance_id)
        owners = self._owners
        for h in block_hashes:
            blocks.add(h)
            owners[h] = owners.get(h, 0) | bit

    def on_blocks_removed(self, instance_id: InstanceId, block_hashes: Sequence[int]) -> None:
        blocks = self._blocks.get(instance_id)
        if blocks is None:
            return
        gone = [h for h in block_hashes if h in blocks]
        blocks.difference_update(gone)
        self._drop_bit(self._bit_of[instance_id], gone)

    def on_instance_cleared(self, instance_id: InstanceId) -> None:
        blocks = self._blocks.get(instance_id)
        if blocks is None:
            self._blocks[instance_id] = set()
            self._bit(instance_id)
            return
        self._drop_bit(self._bit_of[instance_id], blocks)
        blocks.clear()

    def remove_instance(self, instance_id: InstanceId) -> None:
        blocks = self._blocks.pop(instance_id, None)
        self._release(instance_id, blocks or ())

    def retain(self, instance_ids: Iterable[InstanceId]) -> None:
        keep = set(instance_ids)
        for iid in [i for i in self._blocks if i not in keep]:
            self.remove_instance(iid)
