"""Prefix indexes: which instance is predicted to hold which chained block hashes.

Both indexes keep a reverse map ``block hash -> bitmask of instances``, so the longest-prefix
match of a key against *every* instance costs O(matched blocks): walk the key's chain while the
mask of instances holding every block so far is non-zero, noting where each instance drops out.

- ``ApproxPrefixIndex`` learns from routing history (``insert`` on every routed request) and
  forgets like the engine does: one LRU per instance whose capacity mirrors the instance's KV
  capacity in blocks. A key's blocks are touched tail first, so the head of a prefix is always
  more recent than its tail and eviction never leaves a hole in a chain.
- ``ExactPrefixIndex`` (``routing.exact_index``) is fed by engine KV events (``KvEventSink``)
  and has the same ``match``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from warmfleet.core.types import InstanceId
from warmfleet.routing.held_runs import RUN_BASE, HeldRuns
from warmfleet.routing.pending_tails import PendingTails


class BitIndex:
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


class ApproxPrefixIndex(BitIndex):
    """Per-instance LRU of block hashes learnt from routing decisions.

    A routed chain's blocks past what its instance already holds (a prompt's new tail) are kept
    as one *pending tail*: a tuple, and one placeholder in the instance's LRU where its blocks
    would sit, instead of an LRU entry and an owner bit each. ``match`` follows a pending tail
    from where the instance's held run ends; a later chain that runs into a pending tail takes
    the blocks it shares out of it (they become held blocks with owner bits); eviction reaching
    a placeholder drops the tail's deepest blocks first. Held blocks are kept as runs
    (``routing/held_runs.py``): touching a chain's held run moves a run or two, not each block.
    The index answers exactly as one LRU entry per block would
    (``tests/routing/test_routing_index_pending.py``), for chained 64-bit block hashes; the
    tail of a one-off prompt (a unique question, a tool's output) costs one entry instead of
    one per block, on every replica that learns it.
    """

    def __init__(self, default_capacity_blocks: int) -> None:
        if default_capacity_blocks <= 0:
            raise ValueError("default_capacity_blocks must be > 0")
        super().__init__()
        self.default_capacity_blocks = default_capacity_blocks
        self._lru: dict[InstanceId, OrderedDict[int, None]] = {}
        self._capacity: dict[InstanceId, int] = {}
        self._size: dict[InstanceId, int] = {}  # blocks held: runs' + pending tails'
        self._tails: dict[InstanceId, PendingTails] = {}
        self._held: dict[InstanceId, HeldRuns] = {}
        self._starts: dict[int, int] = {}  # a pending tail's first hash -> instances' bits

    def capacity(self, instance_id: InstanceId) -> int:
        return self._capacity.get(instance_id, self.default_capacity_blocks)

    def match(self, block_hashes: Sequence[int]) -> dict[InstanceId, int]:
        """Matched leading blocks per instance: the held run (by bisection), then the pending
        tail that starts where it ends, if any.

        Each instance's held set is prefix-closed along any chain (a block's hash fixes its
        whole prefix, and a chain's head is always touched after its tail), so the mask of
        holders never grows along a key's chain: each run of equal masks is found by binary
        search, in O(changes x log(blocks)) lookups instead of one per matched block.
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
        if self._starts:
            self._follow_tails(block_hashes, out)
        return out

    def _follow_tails(self, block_hashes: Sequence[int], out: dict[InstanceId, int]) -> None:
        """Extend ``out`` by the pending tails that start where each instance's held run ends
        (at the chain's start for an instance with none)."""
        starts, tails, bit_of = self._starts, self._tails, self._bit_of
        n = len(block_hashes)
        for iid, held in out.items():  # (values change, keys do not)
            if held < n and starts.get(block_hashes[held], 0) >> bit_of[iid] & 1:
                out[iid] = held + tails[iid].follow(block_hashes, held)
        bits = starts.get(block_hashes[0], 0)
        while bits:
            low = bits & -bits
            bits ^= low
            iid = self._id_of_bit[low.bit_length() - 1]
            if iid not in out:
                out[iid] = tails[iid].follow(block_hashes, 0)

    def set_capacity(self, instance_id: InstanceId, capacity_blocks: int) -> None:
        """Mirror the instance's KV capacity (``<= 0`` means unknown: the default)."""
        cap = capacity_blocks if capacity_blocks > 0 else self.default_capacity_blocks
        if self._capacity.get(instance_id) == cap:
            return
        self._capacity[instance_id] = cap
        lru = self._lru.get(instance_id)
        if lru is not None and self._size[instance_id] > cap:
            self._evict(instance_id, lru, cap)

    def occupancy(self, instance_id: InstanceId) -> int:
        return self._size.get(instance_id, 0)

    def insert(
        self, instance_id: InstanceId, block_hashes: Sequence[int], held_hint: int = -1
    ) -> None:
        """``instance_id`` now holds the chain ``block_hashes`` (head most recently used).

        ``held_hint``: how many leading blocks the instance is believed to hold already (e.g.
        the decision's ``predicted_cached_blocks``); only a speed hint, a wrong value gives the
        same result."""
        if not block_hashes:
            return
        cap = self.capacity(instance_id)
        lru = self._lru.get(instance_id)
        if lru is None:  # an instance's LRU, size, runs and tails come and go together
            bit = 1 << self._bit(instance_id)
            lru = self._lru[instance_id] = OrderedDict()
            self._size[instance_id] = 0
            self._tails[instance_id] = PendingTails(bit, self._starts)
            self._held[instance_id] = HeldRuns(bit, self._owners, lru)
        tails, runs = self._tails[instance_id], self._held[instance_id]
        hashes = block_hashes[:cap] if len(block_hashes) > cap else block_hashes
        n = len(hashes)
        held = runs.held_run(hashes, held_hint)
        # Touch order, as one entry per block: the new tail (deepest first), then what the
        # chain shares with a pending tail, then the held run.
        shared = tails.follow(hashes, held) if held < n and tails.by_first else 0
        size = self._size[instance_id]
        if held + shared < n:
            new = tuple(hashes[held + shared :])
            if tails.add(new):
                lru[new[-1]] = None
                size += len(new)
            else:  # (not a chain: a hash seen at two places) held as a run
                size += runs.add(new)
        if shared:
            taken, dropped, gone = tails.take(hashes[held], shared)
            if gone is not None:
                del lru[gone]
            size += runs.add(taken) - shared - dropped
        if held:
            runs.touch(hashes, held)
        self._size[instance_id] = size
        if size > cap:
            self._evict(instance_id, lru, cap)

    def _evict(self, instance_id: InstanceId, lru: OrderedDict[int, None], cap: int) -> None:
        tails, runs = self._tails[instance_id], self._held[instance_id]
        bit = self._bit_of[instance_id]
        pop = lru.popitem
        size = self._size[instance_id]
        while size > cap:
            key, _none = pop(last=False)
            # a run or a pending tail (keyed by its last hash): its deepest blocks go first
            back: int | None  # what is left of it, back at the old end under this key
            if key >= RUN_BASE:
                evicted, left = runs.cut(key, size - cap)
                self._drop_bit(bit, evicted)
                size -= len(evicted)
                back = key if left else None
            else:
                removed, back = tails.cut(key, size - cap)
                size -= removed
            if back is not None:
                lru[back] = None
                lru.move_to_end(back, last=False)
        self._size[instance_id] = size

    def remove_instance(self, instance_id: InstanceId) -> None:
        self._lru.pop(instance_id, None)
        self._capacity.pop(instance_id, None)
        self._size.pop(instance_id, None)
        tails = self._tails.pop(instance_id, None)
        if tails is not None:
            tails.clear()
        self._release(instance_id, self.entries(instance_id))
        self._held.pop(instance_id, None)

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
        return sum(self._size.values())

    def holders(self, block_hash: int) -> int:
        """Number of instances holding ``block_hash`` (pending tails included: linear in
        their number, for tests and diagnostics, not the request path)."""
        pending = sum(
            1
            for tails in self._tails.values()
            if any(block_hash in tail for tail in tails.by_first.values())
        )
        return super().holders(block_hash) + pending

    def entries(self, instance_id: InstanceId) -> list[int]:
        """The instance's held blocks (those with owner bits), least recently used first
        (pending tails' blocks are not among them)."""
        runs = self._held.get(instance_id)
        return [] if runs is None else list(runs.blocks())
