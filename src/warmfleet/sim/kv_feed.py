"""The simulated engines' KV events (vLLM's ``BlockStored``/``BlockRemoved``, sent with
``--kv-events-config``), reaching every gateway replica ``delay_s`` after the engine changed its
cache.

Each engine model reports its cache through a ``BlockListener`` (``listener``); what an engine
reports during one ``advance`` is one batch, as vLLM publishes one batch per scheduler step
(``flush`` closes it and says when it arrives). At its arrival (``deliver``) every replica's
``KvEventSink`` (the strategy's exact index, as the live gateway's translator feeds it) learns
the batch's events in order. The engines' block hashes are the routing keys' own (the simulator
submits each key's chain), so the events need no translation. Events of an instance that the
gateway no longer routes to when they arrive (draining or gone) are dropped. Pure: times come
from the simulator's virtual clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from warmfleet.core.types import InstanceId
from warmfleet.routing.base import KvEventSink

# One event: (instance, stored (True) or removed, block hashes in order)
_Event = tuple[InstanceId, bool, list[int]]


@dataclass(frozen=True, slots=True)
class KvEventsSim:
    """Engines publish KV events; each reaches the gateway replicas ``delay_s`` later."""

    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.delay_s >= 0.0:
            raise ValueError("delay_s must be >= 0")


class _Listener:
    """One engine's ``BlockListener``: its events, appended to the feed's open batch."""

    __slots__ = ("_feed", "_instance_id")

    def __init__(self, instance_id: InstanceId, feed: KvEventFeed) -> None:
        self._instance_id = instance_id
        self._feed = feed

    def block_stored(self, block_hash: int) -> None:
        events = self._feed.open
        if events and events[-1][0] == self._instance_id and events[-1][1]:
            events[-1][2].append(block_hash)  # a run of stores: one BlockStored
        else:
            events.append((self._instance_id, True, [block_hash]))

    def blocks_removed(self, block_hashes: Sequence[int]) -> None:
        if block_hashes:
            self._feed.open.append((self._instance_id, False, list(block_hashes)))


class KvEventFeed:
    """The engines' events on their way to ``sinks`` (one per gateway replica; ``None``: a
    strategy without an exact index, which ignores them)."""

    def __init__(self, config: KvEventsSim, sinks: Sequence[KvEventSink | None]) -> None:
        self.delay_s = config.delay_s
        self._sinks = [s for s in sinks if s is not None]
        self.open: list[_Event] = []  # events of the current advance
        self._batches: deque[tuple[float, list[_Event]]] = deque()  # (arrives at, events)
        self.delivered_events = 0

    def listener(self, instance_id: InstanceId) -> _Listener:
        """The ``BlockListener`` of ``instance_id``'s engine."""
        return _Listener(instance_id, self)

    def flush(self, now_s: float) -> float | None:
        """Close the batch of events reported so far; when it arrives (None: there was none)."""
        if not self.open:
            return None
        arrives_s = now_s + self.delay_s
        self._batches.append((arrives_s, self.open))
        self.open = []
        return arrives_s

    def deliver(self, now_s: float, present: Callable[[InstanceId], bool]) -> None:
        """Feed every sink the batches arrived by ``now_s``, in order; events of an instance
        not ``present`` (routable) then are dropped."""
        batches = self._batches
        while batches and batches[0][0] <= now_s:
            for instance_id, stored, hashes in batches.popleft()[1]:
                if not present(instance_id):
                    continue
                self.delivered_events += 1
                for sink in self._sinks:
                    if stored:
                        sink.on_blocks_stored(instance_id, hashes)
                    else:
                        sink.on_blocks_removed(instance_id, hashes)
