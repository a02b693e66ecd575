"""``Claims``: the blocks a router sent to an instance that reports engine KV events, until
the engine's own events for them can have arrived (docs/routing.md, step 1, "Claims").

An engine publishes a block's ``BlockStored`` once it computed the block, and the event reaches
the router some milliseconds to seconds later (the engine's step, ZeroMQ, a relay, a busy
router). A conversation's next turn, or a burst sharing a new prompt, can be routed in that
gap; without claims the exact index answers "nothing cached anywhere" and the request starts
cold wherever the load is lowest. A claim says "routed there at ``now_s``": for ``ttl_s`` its
blocks extend the exact match of that instance, past what the engine has reported. The engine's
word replaces it as soon as it comes: a ``BlockStored`` or ``BlockRemoved`` of a block drops
its claim, a cleared or removed instance loses all of its claims, and an unconfirmed claim (the
request failed or was cut short) lapses after ``ttl_s``.

Pure and clock-free: callers pass the time (``FleetSnapshot.now_s``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from warmfleet.core.types import InstanceId

DEFAULT_MAX_CLAIMED_BLOCKS = 1 << 16  # per instance: ~ttl_s of new blocks at a busy engine


class _InstanceClaims:
    __slots__ = ("blocks", "expires", "order")

    def __init__(self) -> None:
        self.expires: dict[int, float] = {}  # block hash -> when its latest claim lapses
        self.order: deque[tuple[float, Sequence[int]]] = deque()  # (lapses at, blocks), as claimed
        self.blocks = 0  # in ``order``


class Claims:
    """Per instance: block hash -> when its claim lapses. ``ttl_s <= 0``: no claims;
    ``max_blocks``: the most blocks an instance's claims hold (the oldest claims go first)."""

    def __init__(self, ttl_s: float, max_blocks: int = DEFAULT_MAX_CLAIMED_BLOCKS) -> None:
        if max_blocks <= 0:
            raise ValueError("max_blocks must be > 0")
        self.ttl_s = ttl_s
        self.max_blocks = max_blocks
        self._of: dict[InstanceId, _InstanceClaims] = {}

    def claim(
        self, instance_id: InstanceId, block_hashes: Sequence[int], start: int, now_s: float
    ) -> None:
        """``block_hashes[start:]`` were routed to ``instance_id`` at ``now_s``."""
        if self.ttl_s <= 0 or start >= len(block_hashes):
            return
        state = self._of.get(instance_id)
        if state is None:
            state = self._of[instance_id] = _InstanceClaims()
        order = state.order
        while order and order[0][0] <= now_s:  # lapsed
            _pop_oldest(state)
        lapses_s = now_s + self.ttl_s
        new = block_hashes[start:]
        state.expires.update(dict.fromkeys(new, lapses_s))
        order.append((lapses_s, new))
        state.blocks += len(new)
        while state.blocks > self.max_blocks:
            _pop_oldest(state)

    def extend(
        self, instance_id: InstanceId, block_hashes: Sequence[int], depth: int, now_s: float
    ) -> int:
        """``depth`` leading blocks known held, plus the claimed blocks that follow them."""
        state = self._of.get(instance_id)
        if state is None or not state.expires:
            return depth
        get, n = state.expires.get, len(block_hashes)
        while depth < n and get(block_hashes[depth], now_s) > now_s:
            depth += 1
        return depth

    def drop(self, instance_id: InstanceId, block_hashes: Iterable[int]) -> None:
        """The engine reported these blocks (stored or removed): its word replaces their claims
        (so claims live only while events are on their way, a small map)."""
        state = self._of.get(instance_id)
        if state is not None:
            pop = state.expires.pop
            for h in block_hashes:
                pop(h, None)

    def forget(self, instance_id: InstanceId) -> None:
        self._of.pop(instance_id, None)

    def count(self, instance_id: InstanceId, now_s: float) -> int:
        """Blocks claimed at ``instance_id`` and not lapsed at ``now_s`` (diagnostics)."""
        state = self._of.get(instance_id)
        if state is None:
            return 0
        return sum(1 for lapses_s in state.expires.values() if lapses_s > now_s)


def _pop_oldest(state: _InstanceClaims) -> None:
    """The oldest claim goes: its blocks that no later claim renewed."""
    at, blocks = state.order.popleft()
    state.blocks -= len(blocks)
    expires = state.expires
    for h in blocks:
        if expires.get(h) == at:
            del expires[h]
