"""The gateway's adapter of flow control (``warmfleet.flow.FlowGate``; docs/flow-control.md).

A variant whose routing config has ``flow`` gets one ``FlowGate``, the object the simulator
drives: every inference request is submitted to it. A ``Dispatch`` is committed at once (the
strategy learns it, the instance's load counts it) and routed as usual, its reason (``queued``,
``spill_after_wait`` or the strategy's own) in the metric label and ``x-warmfleet-reason``; a
queued request parks on a future until a drain dispatches or sheds it; a ``Shed`` is answered
429 (503 when no replica became ready in time) in the OpenAI error envelope with
``Retry-After``. Drains run when a request of the variant finishes, when its routable set
changes (a first replica ready: zero-ready requests wait here, not in ``spec.hold``), and from
the lifespan's timer task at the gate's next deadline (at least every ``TICK_S`` while requests
wait). A client that leaves while queued is withdrawn (``FlowGate.cancel``).

Flow identity: the tenant (the key's: ``prompt_cache_key``, else the tenant header), the
session (``x-warmfleet-session`` or an agent's session header), ``x-warmfleet-priority`` and
``x-warmfleet-deadline-ms`` (``flow.model.parse_priority`` / ``parse_deadline_ms``: a bad value
is a 400 naming the header).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

from warmfleet.core.errors import NoInstanceAvailableError, WarmfleetError
from warmfleet.core.types import Decision, FleetSnapshot, Reason, RoutingKey
from warmfleet.engine.presets import get_preset
from warmfleet.flow.gate import FlowGate
from warmfleet.flow.model import (
    NO_TENANT,
    Dispatch,
    FlowRequest,
    Outcome,
    Shed,
    TtftPredictor,
    parse_deadline_ms,
    parse_priority,
)
from warmfleet.gateway.errors import InternalError, OverloadedError, error_response
from warmfleet.gateway.flow_metrics import FlowCollector
from warmfleet.gateway.http.messages import Response
from warmfleet.gateway.instance import InstanceRuntime
from warmfleet.gateway.metrics import FastHistogramChild, GatewayMetrics
from warmfleet.gateway.variant import RouterLike, VariantRuntime
from warmfleet.gateway.world import GatewayState
from warmfleet.routing.flow_config import FlowControlConfig
from warmfleet.routing.replica_notes import RoutedNote

log = logging.getLogger(__name__)

PRIORITY_HEADER = "x-warmfleet-priority"
DEADLINE_HEADER = "x-warmfleet-deadline-ms"
TICK_S = 0.25  # while requests wait, drained at least this often (an instance joined, came back)


class FlowIdentity(NamedTuple):
    """Who sent a request, as flow control reads it (``priority`` None: the default)."""

    tenant: str
    session: str | None
    priority: int | None
    deadline_ms: float | None


def flow_identity(
    headers: Mapping[str, str], tenant: str | None, session: str | None
) -> FlowIdentity:
    """The request's flow identity; ``BadRequestError`` naming a bad priority or deadline."""
    raw = headers.get(PRIORITY_HEADER)
    priority = None if raw is None else parse_priority(raw, PRIORITY_HEADER)
    raw = headers.get(DEADLINE_HEADER)
    deadline_ms = None if raw is None else parse_deadline_ms(raw, DEADLINE_HEADER)
    return FlowIdentity(NO_TENANT if tenant is None else tenant, session, priority, deadline_ms)


class Ticket:
    """A dispatched request: committed (the strategy learnt it, the instance's load counts it,
    ``note`` goes to the peers), handed to the proxy, which releases the load and the note."""

    __slots__ = (
        "cost",
        "deadline_ms",
        "decision",
        "dispatched_s",
        "flow",
        "inst",
        "note",
        "predicted_s",
        "priority",
        "rid",
    )

    def __init__(
        self,
        flow: VariantFlow,
        dispatch: Dispatch,
        inst: InstanceRuntime,
        note: RoutedNote | None,
        dispatched_s: float,
    ) -> None:
        self.flow = flow
        self.rid = dispatch.request.request_id
        self.decision: Decision = dispatch.decision
        self.inst = inst
        self.note = note
        key = dispatch.request.key
        self.cost = key.prompt_tokens + key.output_tokens_hint
        self.dispatched_s = dispatched_s
        self.predicted_s = dispatch.predicted_ttft_s
        request = dispatch.request  # the priority and own deadline it went by (the capture's)
        self.priority = request.priority
        deadline_s = request.deadline_s
        self.deadline_ms = None if deadline_s is None else (deadline_s - request.arrival_s) * 1e3

    def first_token(self) -> None:
        """The answer's first streamed bytes reached the client (calibrates the predictor)."""
        self.flow.first_token(self)

    def done(self) -> None:
        """The request ended, however it ended (its load and note are the proxy's to release)."""
        self.flow.finished(self)

    def abandon(self) -> None:
        """Never handed to the proxy (the client left as it was dispatched): undo the commit."""
        self.inst.add_load(-1, -self.cost)
        if self.note is not None:
            self.flow.variant.finished(self.note)
        self.flow.finished(self)


class VariantFlow:
    """One variant's gate, its parked requests (future and router, by request id) and drains."""

    def __init__(self, owner: GatewayFlow, variant: VariantRuntime, config: FlowControlConfig):
        self.owner = owner
        self.variant = variant
        self.config = config
        predictor = TtftPredictor(get_preset(config.engine_preset))
        self.gate = FlowGate(config, self._choose, predictor)
        self.parked: dict[int, tuple[asyncio.Future[Ticket | Shed], RouterLike]] = {}
        self._draining = False
        self._again = False
        self._first: set[int] = set()  # dispatched, first token not seen yet
        metrics = owner.metrics
        self._waits: dict[tuple[int, str, str], FastHistogramChild] = {}  # bands x tenants x 2
        self._ttft_predicted = metrics.flow_ttft.labels(variant.endpoint, variant.name, "predicted")
        self._ttft_observed = metrics.flow_ttft.labels(variant.endpoint, variant.name, "observed")

    def _observe_wait(self, request: FlowRequest, waited_s: float, how: str) -> None:
        gate = self.gate
        slot = (gate.band_of(request.priority), gate.tenant_label(request.tenant), how)
        child = self._waits.get(slot)
        if child is None:
            variant = self.variant
            band = gate.band_name(slot[0])
            labels = (variant.endpoint, variant.name, band, slot[1], how)
            child = self._waits[slot] = self.owner.metrics.flow_wait.labels(*labels)
        child.observe(waited_s)

    def _choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        return self.variant.router.choose(key, fleet)  # the router in force

    def commit(self, dispatch: Dispatch, router: RouterLike) -> Ticket:
        variant = self.variant
        decision = dispatch.decision
        inst = variant.instances[decision.instance_id]  # in the snapshot just taken
        try:
            note = variant.routed(router, dispatch.request.key, decision)
        except Exception:
            self.gate.on_finished(dispatch.request.request_id, self.owner.clock())
            raise
        ticket = Ticket(self, dispatch, inst, note, self.owner.clock())
        inst.add_load(1, ticket.cost)
        self._first.add(ticket.rid)
        self._observe_wait(dispatch.request, dispatch.waited_s, "dispatched")
        return ticket

    async def wait(self, rid: int, router: RouterLike) -> Ticket | Shed:
        """Until a drain dispatches or sheds request ``rid``; a client that leaves meanwhile
        takes it out of the queue (or, dispatched just then, undoes its commit)."""
        future: asyncio.Future[Ticket | Shed] = asyncio.get_running_loop().create_future()
        self.parked[rid] = (future, router)
        self.owner.wake()  # its deadline may be the next one
        try:
            return await future
        except asyncio.CancelledError:
            self.parked.pop(rid, None)
            if self.gate.cancel(rid):
                self.owner.cancelled(self)
            elif future.done() and not future.cancelled():
                result = future.result()
                if isinstance(result, Ticket):
                    result.abandon()
            raise

    def deliver(self, outcome: Outcome) -> None:
        """Hand an outcome of the gate to its parked request."""
        rid = outcome.request.request_id
        future, router = self.parked.pop(rid, (None, None))
        if future is None or router is None or future.done():  # its client left
            if isinstance(outcome, Dispatch):
                self.gate.on_finished(rid, self.owner.clock())
            return
        if not isinstance(outcome, Dispatch):
            future.set_result(outcome)
            return
        try:
            future.set_result(self.commit(outcome, router))
        except Exception as err:  # the strategy's on_routed failed: its waiter answers 500
            future.set_exception(err)

    def drain(self) -> None:
        """Take the gate's outcomes until none is due (re-entrant calls are folded in)."""
        if self._draining:
            self._again = True
            return
        if not self.gate.demand():
            return  # nothing queued: nothing to dispatch or shed
        self._draining = True
        try:
            self._again = True
            while self._again:
                self._again = False
                while (outcome := self.gate.next_outcome(self.variant.snapshot())) is not None:
                    self.deliver(outcome)
        except Exception:  # a strategy bug: the queued requests still leave at their deadlines
            log.exception("flow drain failed in %s/%s", self.variant.endpoint, self.variant.name)
        finally:
            self._draining = False

    def first_token(self, ticket: Ticket) -> None:
        if ticket.rid not in self._first:
            return
        self._first.discard(ticket.rid)
        now_s = self.owner.clock()
        self.gate.on_first_token(ticket.rid, now_s)
        self._ttft_predicted.observe(ticket.predicted_s)
        self._ttft_observed.observe(now_s - ticket.dispatched_s)

    def finished(self, ticket: Ticket) -> None:
        self._first.discard(ticket.rid)
        self.gate.on_finished(ticket.rid, self.owner.clock())
        self.drain()

    def busy(self) -> bool:
        return bool(self.parked) or self.gate.demand() > 0 or self.gate.running() > 0

    def shed_response(self, shed: Shed) -> Response:
        variant = self.variant
        where = f"variant {variant.name!r} of endpoint {variant.endpoint!r}"
        after = f"retry after {shed.retry_after_s} s"
        err: WarmfleetError
        if shed.status == 503:
            err = NoInstanceAvailableError(f"no ready instance in {where} in time; {after}")
        elif shed.reason is Reason.DEADLINE:
            err = OverloadedError(f"{where} cannot start this request before its deadline; {after}")
        else:
            err = OverloadedError(f"{where} is overloaded (its queue is full); {after}")
        reason = str(shed.reason)
        variant.request_counter("none", reason, str(shed.status)).inc()
        self._observe_wait(shed.request, shed.waited_s, "shed")
        headers = {"Retry-After": str(shed.retry_after_s)}
        return error_response(err, reason=reason, extra_headers=headers)


class GatewayFlow:
    """Every variant's ``VariantFlow``; its ``run`` is the timer task of the gateway's lifespan."""

    def __init__(
        self,
        state: GatewayState,
        metrics: GatewayMetrics,
        clock: Callable[[], float],
        on_routable: Callable[[VariantRuntime], None],
    ) -> None:
        self.state = state
        self.metrics = metrics
        self.clock = clock
        self._also_routable = on_routable  # spec.hold's release (a variant may switch modes)
        self.flows: dict[VariantRuntime, VariantFlow] = {}
        self.retired: list[VariantFlow] = []  # replaced by a new config: drained until idle
        self.cancelled_count: dict[tuple[str, str], int] = {}
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._on_routable = self._routable  # one bound method (compared on every request)
        metrics.registry.register(FlowCollector(self._gates, lambda: self.cancelled_count))
        state.series_owners.append(self)  # told when a removed variant's series go

    def flow_of(self, variant: VariantRuntime, config: FlowControlConfig) -> VariantFlow:
        flow = self.flows.get(variant)
        if flow is None or (flow.config is not config and flow.config != config):
            if flow is not None:
                self.retired.append(flow)
            flow = self.flows[variant] = VariantFlow(self, variant, config)
        if variant.on_routable is not self._on_routable:
            variant.on_routable = self._on_routable
        return flow

    async def admit(
        self, variant: VariantRuntime, router: RouterLike, key: RoutingKey, who: FlowIdentity
    ) -> Ticket | Response:
        """Submit a request to its variant's gate: the ticket to route it with, or the answer
        (429/503 + ``Retry-After``) when it is shed."""
        config = variant.routing_config.flow
        assert config is not None
        flow = self.flow_of(variant, config)
        gate = flow.gate
        fleet = variant.snapshot()
        now_s = fleet.now_s
        rid = next(self._ids)
        priority = who.priority if who.priority is not None else gate.default_priority(who.tenant)
        deadline_s = None if who.deadline_ms is None else now_s + who.deadline_ms / 1000.0
        request = FlowRequest(rid, key, who.tenant, priority, now_s, deadline_s, who.session)
        try:
            outcome = gate.submit(request, fleet)
        except Exception as err:  # a strategy bug must not become an HTML 500 or a crash
            log.exception("routing failed in %s/%s", variant.endpoint, variant.name)
            return error_response(InternalError(f"routing failed: {type(err).__name__}"))
        if outcome is not None and outcome.request.request_id != rid:
            flow.deliver(outcome)  # a queued request gave way to this one: shed
            outcome = None
        result: Ticket | Shed
        try:
            if outcome is None:
                result = await flow.wait(rid, router)
            elif isinstance(outcome, Dispatch):
                result = flow.commit(outcome, router)
            else:
                result = outcome
        except Exception as err:  # a strategy bug must not become an HTML 500 or a crash
            log.exception("routing failed in %s/%s", variant.endpoint, variant.name)
            return error_response(InternalError(f"routing failed: {type(err).__name__}"))
        return result if isinstance(result, Ticket) else flow.shed_response(result)

    def _routable(self, variant: VariantRuntime) -> None:
        flow = self.flows.get(variant)
        if flow is not None:
            flow.drain()
        self._also_routable(variant)

    def wake(self) -> None:
        self._wake.set()

    def _gates(self) -> Iterator[tuple[tuple[str, str], FlowGate, bool]]:
        for flow in self.all():
            current = self.flows.get(flow.variant) is flow
            yield (flow.variant.endpoint, flow.variant.name), flow.gate, current

    def all(self) -> list[VariantFlow]:
        return [*self.flows.values(), *self.retired]

    def _prune(self) -> None:
        """Variants gone or without flow control any more: their gates drain until idle."""
        live = set(self.state.variants())
        for variant, flow in list(self.flows.items()):
            if variant not in live or variant.routing_config.flow != flow.config:
                del self.flows[variant]
                self.retired.append(flow)
        self.retired = [f for f in self.retired if f.busy()]

    def _next_wake_s(self) -> float | None:
        """Seconds until the next drain is due (None: only when woken)."""
        flows = self.all()
        due = [d for f in flows if (d := f.gate.next_deadline_s()) is not None]
        timeout_s = max(0.0, min(due) - self.clock()) if due else None
        if any(f.gate.demand() for f in flows):
            timeout_s = TICK_S if timeout_s is None else min(timeout_s, TICK_S)
        return timeout_s

    async def run(self) -> None:
        """Drain every gate at its next deadline (and every ``TICK_S`` while requests wait)."""
        while True:
            timeout_s = self._next_wake_s()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._wake.wait()
            self._prune()
            for flow in self.all():
                flow.drain()

    def waiting(self, endpoint: str, variant: str) -> bool:
        """Whether a flow of that variant (a retired one too) still has a request."""
        where = (endpoint, variant)
        return any(f.busy() for f in self.all() if (f.variant.endpoint, f.variant.name) == where)

    def forget_variant(self, endpoint: str, variant: str) -> None:
        """That variant is gone and its flows are idle: they leave now, its count too."""
        self._prune()
        self.cancelled_count.pop((endpoint, variant), None)

    def cancelled(self, flow: VariantFlow) -> None:
        key = (flow.variant.endpoint, flow.variant.name)
        self.cancelled_count[key] = self.cancelled_count.get(key, 0) + 1
