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

``ClaimCounts`` says how claims ended, for the gateway's metrics: a block's claim is
``confirmed`` by its ``BlockStored`` within ``ttl_s``, ``late`` if that came after the claim had
lapsed (the engine's events take longer than ``ttl_s``), ``lapsed`` if no word came, or
``displaced`` by the bound on claimed blocks. Renewed, removed and forgotten claims count in none.

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


class ClaimCounts:
    """Blocks claimed, and how their claims ended (the module's docstring), since the start."""

    __slots__ = ("claimed", "confirmed", "displaced", "lapsed", "late")

    def __init__(self) -> None:
        self.claimed = 0
        self.confirmed = 0
        self.late = 0
        self.lapsed = 0
        self.displaced = 0


class Claims:
    """Per instance: block hash -> when its claim lapses. ``ttl_s <= 0``: no claims;
    ``max_blocks``: the most blocks an instance's claims hold (the oldest claims go first)."""

    def __init__(self, ttl_s: float, max_blocks: int = DEFAULT_MAX_CLAIMED_BLOCKS) -> None:
        if max_blocks <= 0:
            raise ValueError("max_blocks must be > 0")
        self.ttl_s = ttl_s
        self.max_blocks = max_blocks
        self.counts = ClaimCounts()
        # The latest time a claim or a match was made at: an engine's word for a claim lapsed
        # by then is ``late`` (one lapsed since, with no routing in between, counts confirmed).
        self.latest_s = 0.0
        self._of: dict[InstanceId, _InstanceClaims] = {}

    def claim(
        self, instance_id: InstanceId, block_hashes: Sequence[int], start: int, now_s: float
    ) -> None:
        """``block_hashes[start:]`` were routed to ``instance_id`` at ``now_s``."""
        if self.ttl_s <= 0 or start >= len(block_hashes):
            return
        self.latest_s = now_s
        state = self._of.get(instance_id)
        if state is None:
            state = self._of[instance_id] = _InstanceClaims()
        order, counts = state.order, self.counts
        while order and order[0][0] <= now_s:
            counts.lapsed += _pop_oldest(state)
        lapses_s = now_s + self.ttl_s
        new = block_hashes[start:]
        state.expires.update(dict.fromkeys(new, lapses_s))
        order.append((lapses_s, new))
        state.blocks += len(new)
        counts.claimed += len(new)
        while state.blocks > self.max_blocks:
            counts.displaced += _pop_oldest(state)

    def extend(
        self, instance_id: InstanceId, block_hashes: Sequence[int], depth: int, now_s: float
    ) -> int:
        """``depth`` leading blocks known held, plus the claimed blocks that follow them."""
        self.latest_s = now_s
        state = self._of.get(instance_id)
        if state is None or not state.expires:
            return depth
        get, n = state.expires.get, len(block_hashes)
        while depth < n and get(block_hashes[depth], now_s) > now_s:
            depth += 1
        return depth

    def drop(
        self, instance_id: InstanceId, block_hashes: Iterable[int], *, stored: bool = False
    ) -> None:
        """The engine reported these blocks (``stored``, else removed): its word replaces their
        claims (so claims live only while events are on their way, a small map)."""
        state = self._of.get(instance_id)
        if state is None or not state.expires:
            return
        pop = state.expires.pop
        if not stored:  # a removal: its claims end in no count
            for h in block_hashes:
                pop(h, None)
            return
        counts, latest_s = self.counts, self.latest_s
        for h in block_hashes:
            lapses_s = pop(h, None)
            if lapses_s is None:
                continue
            if lapses_s > latest_s:
                counts.confirmed += 1
            else:
                counts.late += 1

    def forget(self, instance_id: InstanceId) -> None:
        self._of.pop(instance_id, None)

    def instances(self) -> tuple[InstanceId, ...]:
        """The instances that have held claims (until forgotten)."""
        return tuple(self._of)

    def count(self, instance_id: InstanceId, now_s: float) -> int:
        """Blocks claimed at ``instance_id`` and not lapsed at ``now_s`` (the gateway's gauge)."""
        state = self._of.get(instance_id)
        if state is None:
            return 0
        return sum(1 for lapses_s in state.expires.values() if lapses_s > now_s)


def _pop_oldest(state: _InstanceClaims) -> int:
    """The oldest claim goes: its blocks that no later claim renewed and no word replaced
    (returned: how many)."""
    at, blocks = state.order.popleft()
    state.blocks -= len(blocks)
    expires = state.expires
    gone = 0
    for h in blocks:
        if expires.get(h) == at:
            del expires[h]
            gone += 1
    return gone
