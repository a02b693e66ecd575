"""The simulator's side of flow control: a ``FlowGate`` (``warmfleet.flow``, the gateway's own
objects) fed the simulated requests, and what its outcomes write into their records.

The kernel (``sim.simulator``) hands each arriving request to ``admit``-side helpers here and
acts on the outcomes: a ``Dispatch`` is routed with the gate's decision, a ``Shed`` is answered
at once (``RequestRecord.rejected`` with ``shed_status``), so a run's requests stay conserved:
each one completes, is refused by an engine, or is shed, exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from warmfleet.core.types import Decision, FleetSnapshot, RoutingKey
from warmfleet.flow.gate import FlowGate
from warmfleet.flow.model import NO_TENANT, Dispatch, FlowRequest, Outcome
from warmfleet.sim.records import RequestRecord
from warmfleet.sim.workloads.base import WorkloadRequest


class SimFlow:
    """One simulated gateway's flow control over the run's requests and keys."""

    def __init__(
        self,
        gate: FlowGate,
        requests: Sequence[WorkloadRequest],
        keys: Sequence[RoutingKey],
        records: Sequence[RequestRecord],
    ) -> None:
        self.gate = gate
        self.records = records
        self._requests = requests
        self._keys = keys
        self.timer_s = float("inf")  # the earliest deadline check already scheduled

    def request(self, index: int, now_s: float) -> FlowRequest:
        """The flow-control view of request ``index`` arriving at ``now_s``."""
        req = self._requests[index]
        tenant = req.tenant if req.tenant is not None else NO_TENANT
        priority = req.priority if req.priority is not None else self.gate.default_priority(tenant)
        deadline_s = None if req.deadline_ms is None else now_s + req.deadline_ms / 1000.0
        session = None if req.session_id is None else str(req.session_id)
        return FlowRequest(index, self._keys[index], tenant, priority, now_s, deadline_s, session)

    def due_timer_s(self, now_s: float) -> float | None:
        """When to wake the gate next, if that is earlier than the wake-up already planned."""
        due_s = self.gate.next_deadline_s()
        if due_s is None or due_s >= self.timer_s:
            return None
        self.timer_s = max(due_s, now_s)
        return self.timer_s

    def drain(
        self,
        fleet: Callable[[], FleetSnapshot],
        route: Callable[[int, Decision], None],
        unserved: Callable[[int], None],
        admit: int | None = None,
        *,
        timer: bool = False,
    ) -> float | None:
        """Submit request ``admit`` (if any), then take the gate's outcomes until none is due:
        ``route`` each dispatch, record each shed and tell ``unserved``. Returns when to wake
        the gate again (None: a wake-up is already planned, or none is needed)."""
        if timer:
            self.timer_s = float("inf")
        snapshot = fleet()
        gate = self.gate
        if admit is not None:
            self._apply(gate.submit(self.request(admit, snapshot.now_s), snapshot), route, unserved)
            snapshot = fleet()
        while (outcome := gate.next_outcome(snapshot)) is not None:
            self._apply(outcome, route, unserved)
            snapshot = fleet()
        return self.due_timer_s(snapshot.now_s)

    def _apply(
        self,
        outcome: Outcome | None,
        route: Callable[[int, Decision], None],
        unserved: Callable[[int], None],
    ) -> None:
        if outcome is None:
            return
        index = outcome.request.request_id
        record = self.records[index]
        if isinstance(outcome, Dispatch):
            record.queued_s = outcome.waited_s
            record.predicted_ttft_s = outcome.predicted_ttft_s
            route(index, outcome.decision)
            return
        record.reason = str(outcome.reason)
        record.rejected = True
        record.shed_status = outcome.status
        record.queued_s = outcome.waited_s
        record.finish_s = outcome.request.arrival_s + outcome.waited_s
        unserved(index)
