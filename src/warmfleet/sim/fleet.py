"""The kernel's two extension points: what serves an instance, and who starts instances.

``Server`` is what ``Simulator`` runs per instance: an ``EngineModel`` by default (vLLM-like
steps, prefix cache), or a calibrated stand-in such as ``sim.servers.SlotServer`` when a run is
about fleet sizing rather than caches. ``FleetController`` is called every ``period_s`` of
virtual time before ``until_s`` with a ``FleetView`` and returns the instances to start (an
autoscaler and its placement); each becomes routable ``ready_in_s`` after its start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from warmfleet.engine.events import EngineEvent, EngineRequest, EngineStats


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
