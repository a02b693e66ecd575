"""The kernel's two extension points: what serves an instance, and who starts instances.

``Server`` is what ``Simulator`` runs per instance: an ``EngineModel`` by default (vLLM-like
steps, prefix cache), or a calibrated stand-in such as ``sim.servers.SlotServer`` when a run is
about fleet sizing rather than caches. ``FleetController`` is called every ``period_s`` of
virtual time before ``until_s`` with a ``FleetView`` and returns the instances to start (an
autoscaler and its placement); each becomes routable ``ready_in_s`` after its start.
``fleet_snapshot`` and ``record_reuse`` read the kernel's servers at a decision.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from warmfleet.core.types import FleetSnapshot, InstanceId, InstanceState
from warmfleet.engine.events import EngineEvent, EngineRequest, EngineStats
from warmfleet.routing.replicas import ReplicaView
from warmfleet.sim.records import RequestRecord


class Server(Protocol):
    """One instance's request processing, in virtual time (``EngineModel`` implements it)."""

    def submit(self, req: EngineRequest, now_s: float) -> None: ...

    def next_event_s(self) -> float | None:
        """Time of the next event ``advance`` would return, None when idle."""
        ...

    def advance(self, until_s: float) -> list[EngineEvent]:
        """Every event at or before ``until_s``, in time order."""
        ...

    def stats(self) -> EngineStats: ...

    def cached_prefix_blocks(self, block_hashes: tuple[int, ...] | list[int]) -> int: ...

    def check_invariants(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Join:
    """Start one instance now; it takes traffic ``ready_in_s`` later (0: at once)."""

    ready_in_s: float = 0.0
    tag: str = ""  # the controller's name for it, reported back in ``SimResult.joins``


@dataclass(frozen=True, slots=True)
class FleetView:
    """The fleet as a controller sees it at a tick."""

    now_s: float
    replicas: int  # started and not removed, ready or not
    ready: int  # of them, taking traffic
    in_flight_requests: int  # routed and not finished, plus those waiting for a ready instance


class FleetController(Protocol):
    """Starts instances while the run goes (an autoscaler); pure, deterministic."""

    @property
    def period_s(self) -> float:
        """Virtual seconds between ticks (the first tick is at 0)."""
        ...

    @property
    def until_s(self) -> float:
        """No tick at or after this time."""
        ...

    def tick(self, fleet: FleetView) -> Sequence[Join]:
        """The instances to start now (possibly none)."""
        ...


class EnginePolls:
    """The engines' queue and KV usage as a gateway polling their metrics every ``interval_s``
    last read them (``gateway.engine_stats``; ``routing.base.engine_stats_interval_of``).

    ``advance(now_s, servers)`` is called as virtual time moves to ``now_s``, before the
    events at ``now_s`` change anything: when a poll time (a multiple of ``interval_s``) lies
    in ``(previous now, now_s]``, the engines are in the state they were in at that poll, so
    reading them now is reading them then. An instance not polled yet reads (0, 0.0), unknown.
    """

    __slots__ = ("_poll", "interval_s", "polled")

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.polled: dict[InstanceId, tuple[int, float]] = {}
        self._poll = -1  # the latest poll's number (its time / interval_s)

    def advance(self, now_s: float, servers: Mapping[InstanceId, Server]) -> None:
        poll = math.floor(now_s / self.interval_s)
        if poll > self._poll:
            self._poll = poll
            self.polled = {
                iid: (stats.waiting, stats.kv_usage_frac)
                for iid, stats in ((iid, server.stats()) for iid, server in servers.items())
            }


def fleet_snapshot(
    active: Sequence[InstanceId],
    servers: Mapping[InstanceId, Server],
    view: ReplicaView,
    now_s: float,
    polls: EnginePolls | None = None,
) -> FleetSnapshot:
    """The ``active`` instances as ``view``'s replica sees them (its in-flight counts, the
    servers' capacities; their queues and KV usage as ``polls`` last read them, else now)."""
    states = []
    requests, tokens = view.in_flight_requests, view.in_flight_tokens
    for instance_id in active:
        stats = servers[instance_id].stats()
        waiting, usage = (
            (stats.waiting, stats.kv_usage_frac)
            if polls is None
            else polls.polled.get(instance_id, (0, 0.0))
        )
        states.append(
            InstanceState(
                instance_id,
                in_flight_requests=requests.get(instance_id, 0),
                in_flight_tokens=tokens.get(instance_id, 0),
                waiting_requests=waiting,
                kv_usage_frac=usage,
                kv_capacity_blocks=stats.capacity_blocks,
            )
        )
    return FleetSnapshot(tuple(states), now_s)


def record_reuse(
    record: RequestRecord,
    block_hashes: tuple[int, ...],
    chosen: InstanceId,
    *,
    active: Sequence[InstanceId],
    servers: Mapping[InstanceId, Server],
    block_tokens: int,
) -> None:
    """The best instance's and the chosen one's actual cached prefix, at decision time."""
    best = 0
    for instance_id in active:
        cached = servers[instance_id].cached_prefix_blocks(block_hashes)
        best = max(best, cached)
        if instance_id == chosen:
            record.captured_tokens = min(cached * block_tokens, record.prompt_tokens)
    record.available_tokens = min(best * block_tokens, record.prompt_tokens)
