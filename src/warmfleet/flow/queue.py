"""The bounded queues of flow control and their dispatch order (pure).

A flow is (band, tenant): FIFO inside a flow. Bands are served in strict priority order;
inside a band, backlogged tenants are served by smallest virtual token counter (VTC, Sheng et
al., "Fairness in Serving Large Language Models", OSDI 2024): each dispatch adds the request's
weighted tokens / its tenant's weight to the tenant's counter, and a tenant that becomes
backlogged is lifted to the smallest counter of the band's backlogged tenants, so idle time
banks no credit. The charge is cache-aware: prompt tokens the chosen instance is predicted to
hold cost nothing (docs/flow-control.md says why).

Bounds: at most ``max_total`` queued requests and ``max_per_flow`` per flow; when full, the
victim is the newest request of the longest flow of the lowest non-empty band, if that band is
lower than the newcomer's or the newcomer's flow is shorter (else the newcomer is refused).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field

from warmfleet.flow.model import FlowRequest

MAX_COUNTERS = 4096  # tenants' counters kept; idle ones are forgotten beyond it (lifted anew)


@dataclass(slots=True, eq=False)
class Queued:
    """A waiting request: ``latest_start_s`` is when it is shed if not started by then."""

    request: FlowRequest
    band: int
    latest_start_s: float
    deadline_is_hold: bool  # the limit is the hold (no replica) / longest wait, not a deadline
    target: str | None = None  # the busy instance it last chose to wait for
    active: bool = True


@dataclass(slots=True)
class _Band:
    flows: dict[str, deque[Queued]] = field(default_factory=dict)
    queued: int = 0


class FlowQueues:
    """Per-(band, tenant) FIFO queues with VTC order, bounds and a deadline heap."""

    def __init__(self, bands: int, max_total: int, max_per_flow: int) -> None:
        self._bands = [_Band() for _ in range(bands)]  # index 0 = highest priority
        self.max_total = max_total
        self.max_per_flow = max_per_flow
        self.queued = 0
        self.counters: dict[str, float] = {}
        self.waiting_for: dict[str, int] = {}  # instance -> queued requests waiting for it
        self.entries: dict[int, Queued] = {}  # request id -> its entry, while queued
        self._deadlines: list[tuple[float, int, Queued]] = []
        self._seq = itertools.count()

    # ------------------------------------------------------------------ bounds

    def flow_length(self, band: int, tenant: str) -> int:
        flow = self._bands[band].flows.get(tenant)
        return len(flow) if flow is not None else 0

    def full_for(self, band: int, tenant: str) -> bool:
        return self.queued >= self.max_total or self.flow_length(band, tenant) >= self.max_per_flow

    def victim_for(self, band: int, tenant: str) -> Queued | None:
        """Who gives way to a newcomer of (``band``, ``tenant``) when the queue is full."""
        if self.flow_length(band, tenant) >= self.max_per_flow:
            return None  # its own flow is at its bound: the newcomer is refused
        mine = self.flow_length(band, tenant)
        for index in range(len(self._bands) - 1, band - 1, -1):
            flows = self._bands[index].flows
            if not flows:
                continue
            longest = max(flows, key=lambda t: len(flows[t]))
            if index > band or (longest != tenant and len(flows[longest]) > mine + 1):
                return flows[longest][-1]
            return None
        return None

    # ------------------------------------------------------------------ queue

    def push(self, entry: Queued) -> None:
        band = self._bands[entry.band]
        tenant = entry.request.tenant
        flow = band.flows.get(tenant)
        if flow is None:
            flow = band.flows[tenant] = deque()
            self._lift(band, tenant)
        flow.append(entry)
        band.queued += 1
        self.queued += 1
        self.entries[entry.request.request_id] = entry
        heapq.heappush(self._deadlines, (entry.latest_start_s, next(self._seq), entry))
        self.retarget(entry, entry.target, new=True)

    def retarget(self, entry: Queued, target: str | None, *, new: bool = False) -> None:
        """``entry`` now waits for ``target`` (None: for no instance in particular)."""
        waiting = self.waiting_for
        if entry.target is not None and not new:
            waiting[entry.target] -= 1
            if not waiting[entry.target]:
                del waiting[entry.target]
        entry.target = target
        if target is not None:
            waiting[target] = waiting.get(target, 0) + 1

    def remove(self, entry: Queued) -> None:
        """Take ``entry`` out (dispatched or shed); lazily dropped from the deadline heap (which
        is rebuilt when most of it is such slots)."""
        band = self._bands[entry.band]
        tenant = entry.request.tenant
        flow = band.flows[tenant]
        if flow[0] is entry:
            flow.popleft()
        else:
            flow.remove(entry)
        if not flow:
            del band.flows[tenant]
        band.queued -= 1
        self.queued -= 1
        self.entries.pop(entry.request.request_id, None)
        entry.active = False
        self.retarget(entry, None)
        heap = self._deadlines
        if len(heap) > 2 * self.queued + 64:  # removed entries' slots: rebuilt, amortised O(1)
            self._deadlines = [item for item in heap if item[2].active]
            heapq.heapify(self._deadlines)

    def _lift(self, band: _Band, tenant: str) -> None:
        """A newly backlogged tenant starts no lower than the band's smallest backlogged
        counter (no credit banked while idle)."""
        others = [self.counters.get(t, 0.0) for t in band.flows if t != tenant]
        floor = min(others) if others else max(self.counters.values(), default=0.0)
        if self.counters.get(tenant, 0.0) < floor:
            self.counters[tenant] = floor
            self._bound_counters(tenant)

    def charge(self, tenant: str, cost: float) -> None:
        counters = self.counters
        counters[tenant] = counters.get(tenant, 0.0) + cost
        self._bound_counters(tenant)

    def _bound_counters(self, keep: str) -> None:
        """Forget idle tenants' counters past ``MAX_COUNTERS`` (memory stays bounded; amortised:
        the backlogged ones, at most one a queued request, stay)."""
        counters = self.counters
        if len(counters) > max(MAX_COUNTERS, 2 * self.queued):
            backlogged = {t for band in self._bands for t in band.flows}
            for name in [t for t in counters if t not in backlogged and t != keep]:
                del counters[name]

    def heads(self) -> list[Queued]:
        """Each flow's first request, in dispatch order: band, then smallest counter."""
        out: list[Queued] = []
        counters = self.counters
        for band in self._bands:
            if not band.flows:
                continue
            tenants = sorted(band.flows, key=lambda t: (counters.get(t, 0.0), t))
            out.extend(band.flows[t][0] for t in tenants)
        return out

    def ahead_of(self, band: int) -> int:
        """Requests queued in ``band`` and every higher band."""
        return sum(b.queued for b in self._bands[: band + 1])

    def band_depths(self) -> list[int]:
        return [b.queued for b in self._bands]

    def flow_depths(self) -> dict[tuple[int, str], int]:
        return {(i, t): len(f) for i, b in enumerate(self._bands) for t, f in b.flows.items()}

    # ------------------------------------------------------------------ deadlines

    def next_deadline_s(self) -> float | None:
        heap = self._deadlines
        while heap and not heap[0][2].active:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def pop_expired(self, now_s: float) -> Queued | None:
        """The queued request with the earliest latest start if it is due by ``now_s``."""
        at_s = self.next_deadline_s()
        if at_s is None or at_s > now_s:
            return None
        return heapq.heappop(self._deadlines)[2]
