"""N gateway replicas in front of the simulated fleet, exchanging the replica-sync notes.

Each replica is a ``routing.replicas.ReplicaView`` over its own strategy object (the same class,
built by ``routing.factory``, as every other replica and as the live gateway). Each arriving
request goes to a replica drawn by a seeded ``random.Random`` (so turns of one session reach
random replicas); that replica chooses from a snapshot carrying its own view of the in-flight
load, learns its decision at once, and its ``RoutedNote`` reaches every other replica
``sync_delay_s`` later. The request's end is seen at once by its replica, and its
``FinishedNote`` reaches the others ``sync_delay_s`` later. ``sync_delay_s=0`` delivers at once;
``None`` never (no sync: each replica learns only its own decisions, as replicas without
shared state do).

Deliveries are events of the simulator's one event loop (``Simulator`` schedules one at the
time ``routed``/``finished`` return and calls ``deliver`` then). With one replica nothing is
sent, no random number is drawn and no event is added: runs are identical to a plain strategy.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from warmfleet.core.types import Decision, InstanceId, RoutingKey
from warmfleet.routing.base import Strategy
from warmfleet.routing.replica_notes import RoutedNote, SyncNote
from warmfleet.routing.replicas import ReplicaView

SIM_VARIANT = "sim"


@dataclass(frozen=True, slots=True)
class GatewaySync:
    """``replicas`` gateway replicas; each note reaches the peers ``sync_delay_s`` after it
    was sent (``None``: never)."""

    replicas: int = 1
    sync_delay_s: float | None = 0.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("replicas must be at least 1")
        if self.sync_delay_s is not None and not self.sync_delay_s >= 0.0:
            raise ValueError("sync_delay_s must be >= 0 or None")

    def build(self, strategy: Callable[[int], Strategy], rng: random.Random) -> Gateways:
        """The replicas, replica ``r`` running ``strategy(r)``; ``rng`` picks the replica of
        each request."""
        strategies = [strategy(r) for r in range(self.replicas)]
        return Gateways(strategies, sync_delay_s=self.sync_delay_s, rng=rng)


class Gateways:
    """The replicas (``views``) and the notes on their way between them."""

    def __init__(
        self,
        strategies: Sequence[Strategy],
        *,
        sync_delay_s: float | None = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        if not strategies:
            raise ValueError("at least one gateway replica")
        if len(strategies) > 1 and rng is None:
            raise ValueError("several replicas need a random.Random to pick one per request")
        self.views = [ReplicaView(f"replica-{r}", SIM_VARIANT, s) for r, s in enumerate(strategies)]
        self.sync_delay_s = sync_delay_s
        self._index = {view.replica_id: r for r, view in enumerate(self.views)}
        self.routed_by: dict[int, int] = {}  # request -> the replica that routed it
        self._rng = rng
        self._notes: dict[int, tuple[ReplicaView, RoutedNote]] = {}  # request -> routed by
        self._pending: deque[tuple[ReplicaView, SyncNote]] = deque()  # sent, not delivered

    def pick(self) -> ReplicaView:
        """The replica a new request reaches."""
        views = self.views
        if len(views) == 1 or self._rng is None:
            return views[0]
        return views[self._rng.randrange(len(views))]

    def routed(
        self, view: ReplicaView, request: int, key: RoutingKey, decision: Decision, now_s: float
    ) -> float | None:
        """``view`` routed ``request``; the time its note is to be delivered (``deliver``),
        None if nothing is to be scheduled."""
        note = view.routed(key, decision)
        self._notes[request] = (view, note)
        self.routed_by[request] = self._index[view.replica_id]
        return self._send(view, note, now_s)

    def finished(self, request: int, now_s: float) -> float | None:
        """``request`` ended; like ``routed``."""
        view, routed = self._notes.pop(request)
        return self._send(view, view.finished(routed), now_s)

    def deliver(self) -> None:
        """The oldest note on its way reaches every other replica (notes are delivered in the
        order they were sent: one delay for all)."""
        origin, note = self._pending.popleft()
        self._apply(origin, note)

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        """Discovery is shared: every replica sees the new instance set at once."""
        for view in self.views:
            view.on_instances_changed(instance_ids)

    def _send(self, origin: ReplicaView, note: SyncNote, now_s: float) -> float | None:
        delay_s = self.sync_delay_s
        if len(self.views) == 1 or delay_s is None:
            return None
        if delay_s == 0.0:
            self._apply(origin, note)
            return None
        self._pending.append((origin, note))
        return now_s + delay_s

    def _apply(self, origin: ReplicaView, note: SyncNote) -> None:
        for view in self.views:
            if view is not origin:
                view.apply(note)
