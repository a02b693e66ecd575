"""``FlowGate``: one variant's flow control over one routing strategy (pure, synchronous).

The caller (the gateway, or the simulator in virtual time) hands every request to ``submit``
and acts on what comes back: a ``Dispatch`` (route it: call the strategy's ``on_routed``, send
it), a ``Shed`` (answer 429/503 with ``Retry-After``), or ``None`` (it waits in the queue).
Whenever something may have changed (a request finished, an instance became ready, the time of
``next_deadline_s`` came) the caller drains ``next_outcome`` until it returns ``None``. It
reports each dispatched request's first token (``on_first_token``: calibrates the TTFT
predictor) and its end (``on_finished``). Every submitted request comes back exactly once, as a
``Dispatch`` or a ``Shed``, unless the caller withdraws it while it waits (``cancel``: its
client left).

Wait or spill: a request whose strategy choice is at its cap while another instance has room
goes where the predicted time to its first token is smaller: the expected wait for the chosen
instance plus its predicted TTFT there, or the predicted TTFT on the strategy's choice among
the instances with room (docs/flow-control.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from warmfleet.core.types import Decision, FleetSnapshot, InstanceId, Reason, RoutingKey
from warmfleet.flow.model import (
    Dispatch,
    FlowRequest,
    Outcome,
    Shed,
    TtftPredictor,
    key_tokens,
    retry_after_s,
)
from warmfleet.flow.queue import FlowQueues, Queued
from warmfleet.flow.tenants import TenantStates, limited
from warmfleet.routing.flow_config import FlowControlConfig, TenantLimits

Choose = Callable[[RoutingKey, FleetSnapshot], Decision]
_BLOCKED = object()  # the whole fleet is at its caps: nothing more can start now


@dataclass(slots=True)
class _Running:
    request: FlowRequest
    instance_id: InstanceId
    dispatched_s: float
    prefill_s: float
    predicted_ttft_s: float
    first_token: bool = False


class FlowGate:
    """Flow control of one variant: ``choose`` is its routing strategy's ``choose``."""

    def __init__(self, config: FlowControlConfig, choose: Choose, predictor: TtftPredictor):
        self.config = config
        self._choose = choose
        self.predictor = predictor
        self._cap = config.max_in_flight_per_instance
        limit_ms = config.max_pending_prefill_ms
        self._pending_limit_s = None if limit_ms is None else limit_ms / 1000.0
        self._band_floors = [b.min_priority for b in config.bands]
        order = sorted(range(len(config.bands)), key=lambda i: -config.bands[i].min_priority)
        self._bands = [config.bands[i] for i in order]
        self.queues = FlowQueues(
            len(self._bands), config.max_queued_requests, config.max_queued_per_flow
        )
        self._running: dict[int, _Running] = {}
        self._in_flight: dict[InstanceId, int] = {}
        self._pending_prefill_s: dict[InstanceId, float] = {}
        self._busy_since_s: dict[InstanceId, float] = {}  # pending prefill since (> 0)
        self._tenants = TenantStates()
        self.service_s = 1.0  # smoothed dispatch-to-finish time of a request
        self.shed_count: dict[tuple[str, str, Reason], int] = {}  # (band, tenant, reason)
        self.served_tokens: dict[tuple[str, str], int] = {}  # (band, tenant) -> tokens
        self.last_wait_s = 0.0
        self.cancelled = 0  # queued requests withdrawn by the caller (``cancel``)
        self._last_target: InstanceId | None = None  # what the last placement waits for

    # ------------------------------------------------------------------ public

    def band_of(self, priority: int) -> int:
        for index, band in enumerate(self._bands):
            if priority >= band.min_priority:
                return index
        return len(self._bands) - 1

    def band_name(self, band: int) -> str:
        return self._bands[band].name

    def default_priority(self, tenant: str) -> int:
        limits = self._limits(tenant)
        if limits.default_priority is not None:
            return limits.default_priority
        return self.config.default_priority

    def submit(self, request: FlowRequest, fleet: FleetSnapshot) -> Outcome | None:
        """Dispatch ``request`` now, shed it, or queue it (``None``)."""
        band = self.band_of(request.priority)
        self._last_target = None
        queues = self.queues
        if (queues.queued == 0 or queues.ahead_of(band) == 0) and fleet.instances:
            placed = self._try_place(request, fleet)
            if isinstance(placed, Dispatch):
                return placed
        return self._enqueue(request, band, fleet)

    def next_outcome(self, fleet: FleetSnapshot) -> Outcome | None:
        """The next shed (a request that can no longer start in time) or dispatch, if any."""
        expired = self.queues.pop_expired(fleet.now_s)
        if expired is not None:
            self.queues.remove(expired)
            status = 503 if expired.deadline_is_hold and not fleet.instances else 429
            return self._shed(expired.request, Reason.DEADLINE, status, fleet.now_s)
        if not fleet.instances or self.queues.queued == 0:
            return None
        for head in self.queues.heads():
            self._last_target = None
            placed = self._try_place(head.request, fleet)
            if placed is _BLOCKED:
                return None
            if isinstance(placed, Dispatch):
                self.queues.remove(head)
                return placed
            if head.target != self._last_target:
                self.queues.retarget(head, self._last_target)
        return None

    def next_deadline_s(self) -> float | None:
        """When ``next_outcome`` must next be called even if nothing else happens."""
        return self.queues.next_deadline_s()

    def cancel(self, request_id: int) -> bool:
        """Withdraw a queued request (its client left): it leaves the queue and never comes
        back as an outcome. False if it is not queued (dispatched or shed already)."""
        entry = self.queues.entries.get(request_id)
        if entry is None:
            return False
        self.queues.remove(entry)
        self.cancelled += 1
        return True

    def on_first_token(self, request_id: int, now_s: float) -> None:
        run = self._running.get(request_id)
        if run is None or run.first_token:
            return
        run.first_token = True
        self._unpend(run.instance_id, run.prefill_s)
        self.predictor.observe(run.predicted_ttft_s, now_s - run.dispatched_s)

    def on_finished(self, request_id: int, now_s: float) -> None:
        run = self._running.pop(request_id, None)
        if run is None:
            return
        if not run.first_token:
            self._unpend(run.instance_id, run.prefill_s)
        self._in_flight[run.instance_id] -= 1
        tenant = self._tenants.get(run.request.tenant)
        if tenant is not None:
            tenant.running -= 1
        self.service_s += 0.05 * (max(now_s - run.dispatched_s, 1e-3) - self.service_s)

    def demand(self) -> int:
        """Requests waiting for a start (the figure an autoscaler reads)."""
        return self.queues.queued

    def running(self) -> int:
        """Dispatched requests not finished yet."""
        return len(self._running)

    def queue_depths(self) -> dict[tuple[str, str], int]:
        """Queued requests per (band name, tenant label)."""
        out: dict[tuple[str, str], int] = {}
        for (band, tenant), depth in self.queues.flow_depths().items():
            label = (self._bands[band].name, self.tenant_label(tenant))
            out[label] = out.get(label, 0) + depth
        return out

    def in_flight(self, instance_id: InstanceId) -> int:
        return self._in_flight.get(instance_id, 0)

    # ------------------------------------------------------------------ placement

    def _try_place(self, request: FlowRequest, fleet: FleetSnapshot) -> object:
        waited = fleet.now_s > request.arrival_s
        if not self._tenant_allows(request, fleet.now_s):
            return None
        decision = self._choose(request.key, fleet)
        target = decision.instance_id
        own_s = self._prefill_s(request.key, decision)
        if self._has_room(target, own_s):
            if waited:
                decision = replace(decision, reason=Reason.QUEUED)
            return self._dispatch(request, decision, fleet.now_s, own_s)
        cold_s = self.predictor.prefill_s(request.key.prompt_tokens, 0)  # fits even uncached
        free = tuple(s for s in fleet.instances if self._has_room(s.instance_id, cold_s))
        if not free:
            if not any(self._has_room(s.instance_id, 0.0) for s in fleet.instances):
                return _BLOCKED  # nothing at all can start now
            return None
        if self.config.spill == "never":
            return None
        alt = self._choose(request.key, FleetSnapshot(free, fleet.now_s))
        if not self._has_room(alt.instance_id, self._prefill_s(request.key, alt)):
            return None
        if self.config.spill == "always":
            reason = Reason.SPILL_AFTER_WAIT if waited else alt.reason
            return self._dispatch(request, replace(alt, reason=reason, spilled=True), fleet.now_s)
        wait_s = self.expected_wait_s(target, fleet.now_s)
        # spilling recomputes the prefix the target holds: the request waits for that work and
        # the instance's other requests wait behind it, so the extra prefill counts twice
        extra_s = self._prefill_s(request.key, alt) - self._prefill_s(request.key, decision)
        spill_s = self._ttft_s(request.key, alt) + max(extra_s, 0.0) * self.predictor.factor
        # once the target has room, its pending prefill has run: waiting = wait + own TTFT
        if spill_s <= wait_s + self._ttft_s(request.key, decision, queued=False):
            reason = Reason.SPILL_AFTER_WAIT if waited else alt.reason
            spilled = replace(alt, reason=reason, spilled=True)
            return self._dispatch(request, spilled, fleet.now_s)
        self._last_target = target
        return None

    def _unpend(self, instance_id: InstanceId, prefill_s: float) -> None:
        left_s = self._pending_prefill_s[instance_id] - prefill_s
        self._pending_prefill_s[instance_id] = left_s if left_s > 1e-9 else 0.0

    def _has_room(self, instance_id: InstanceId, own_prefill_s: float) -> bool:
        """Below the request cap and, with ``maxPendingPrefillMs``, the instance's predicted
        prefill still to run (this request's included) within it (an idle one always fits)."""
        if self._in_flight.get(instance_id, 0) >= self._cap:
            return False
        limit_s = self._pending_limit_s
        if limit_s is None:
            return True
        pending_s = self._pending_prefill_s.get(instance_id, 0.0)
        return pending_s <= 1e-9 or pending_s + own_prefill_s <= limit_s

    def expected_wait_s(self, instance_id: InstanceId, now_s: float) -> float:
        """Until the instance has room: one of its requests finishes (its cap's share of a
        service time), and the prefill already sent to it has run (what is left of it since
        the instance started on it)."""
        over = self._in_flight.get(instance_id, 0) - self._cap + 1
        over += self.queues.waiting_for.get(instance_id, 0)  # queued for it already
        slot_s = self.service_s * max(over, 0) / self._cap
        pending_s = max(self._pending_prefill_s.get(instance_id, 0.0), 0.0) * self.predictor.factor
        busy_s = now_s - self._busy_since_s.get(instance_id, now_s)
        return max(slot_s, pending_s - busy_s, 0.0)

    def _prefill_s(self, key: RoutingKey, decision: Decision) -> float:
        prompt, cached = key_tokens(key, decision.predicted_cached_blocks)
        return self.predictor.prefill_s(prompt, cached)

    def _ttft_s(
        self, key: RoutingKey, decision: Decision, *, queued: bool = True, own_s: float = -1.0
    ) -> float:
        """Predicted TTFT on the decision's instance (``queued``: behind its pending prefill;
        ``own_s``: the request's own prefill there when already known)."""
        iid = decision.instance_id
        decoding = self._in_flight.get(iid, 0)
        queued_s = self._pending_prefill_s.get(iid, 0.0) if queued else 0.0
        if own_s < 0.0:
            own_s = self._prefill_s(key, decision)
        return self.predictor.predict_s(own_s, queued_s, decoding)

    def _dispatch(
        self, request: FlowRequest, decision: Decision, now_s: float, prefill_s: float = -1.0
    ) -> Dispatch:
        iid = decision.instance_id
        key = request.key
        prompt, cached = key_tokens(key, decision.predicted_cached_blocks)
        if prefill_s < 0.0:
            prefill_s = self.predictor.prefill_s(prompt, cached)
        predicted = self._ttft_s(key, decision, own_s=prefill_s)
        self._running[request.request_id] = _Running(request, iid, now_s, prefill_s, predicted)
        self._in_flight[iid] = self._in_flight.get(iid, 0) + 1
        pending_s = self._pending_prefill_s.get(iid, 0.0)
        if pending_s <= 1e-9:
            self._busy_since_s[iid] = now_s
        self._pending_prefill_s[iid] = pending_s + prefill_s
        tokens = (prompt - cached) + self.config.output_token_weight * key.output_tokens_hint
        limits = self._limits(request.tenant)
        if limited(limits):
            state = self._tenants.state(request.tenant, limits, now_s)
            state.start(prompt + key.output_tokens_hint)
        self.queues.charge(request.tenant, tokens / limits.weight)
        flow = (self._bands[self.band_of(request.priority)].name, self.tenant_label(request.tenant))
        self.served_tokens[flow] = self.served_tokens.get(flow, 0) + prompt
        waited_s = now_s - request.arrival_s
        self.last_wait_s = waited_s
        return Dispatch(request, decision, waited_s, predicted)

    # ------------------------------------------------------------------ queue, limits

    def _enqueue(self, request: FlowRequest, band: int, fleet: FleetSnapshot) -> Outcome | None:
        now_s = fleet.now_s
        hold_s = request.arrival_s + self.config.max_wait_ms / 1000.0
        slo_ms = self._bands[band].ttft_slo_ms
        deadline_s = request.deadline_s
        if deadline_s is None and slo_ms is not None:
            deadline_s = request.arrival_s + slo_ms / 1000.0
        wait_s = self._expected_queue_wait_s(band, fleet)
        if deadline_s is not None:
            min_ttft_s = self._min_ttft_s(request.key)
            if now_s + wait_s + min_ttft_s > deadline_s:
                return self._shed(request, Reason.DEADLINE, 429, now_s, wait_s)
        latest_s = (
            hold_s
            if deadline_s is None
            else min(hold_s, deadline_s - self._min_ttft_s(request.key))
        )
        queued = Queued(
            request, band, latest_s, deadline_s is None or hold_s <= deadline_s, self._last_target
        )
        if self.queues.full_for(band, request.tenant):
            victim = self.queues.victim_for(band, request.tenant)
            if victim is None:
                return self._shed(request, Reason.SHED, 429, now_s, wait_s)
            self.queues.remove(victim)
            self.queues.push(queued)
            return self._shed(victim.request, Reason.SHED, 429, now_s, wait_s)
        self.queues.push(queued)
        return None

    def _expected_queue_wait_s(self, band: int, fleet: FleetSnapshot) -> float:
        slots = len(fleet.instances) * self._cap
        if slots == 0:
            return 0.0  # no replica: unknown; the hold bounds it
        busy = sum(self._in_flight.get(s.instance_id, 0) >= self._cap for s in fleet.instances)
        if busy < len(fleet.instances):
            return 0.0
        return self.service_s * (self.queues.ahead_of(band) + 1) / slots

    def _min_ttft_s(self, key: RoutingKey) -> float:
        """The TTFT it would get on an idle instance holding its whole prefix."""
        return self.predictor.factor * self.predictor.prefill_s(
            key.prompt_tokens, key.prompt_tokens
        )

    def _shed(
        self, request: FlowRequest, reason: Reason, status: int, now_s: float, wait_s: float = 0.0
    ) -> Shed:
        band = self._bands[self.band_of(request.priority)].name
        flow = (band, self.tenant_label(request.tenant), reason)
        self.shed_count[flow] = self.shed_count.get(flow, 0) + 1
        expected = max(wait_s, self.service_s / max(self._cap, 1))
        return Shed(request, reason, status, retry_after_s(expected), now_s - request.arrival_s)

    def _limits(self, tenant: str) -> TenantLimits:
        return self.config.tenants.get(tenant, self.config.default_tenant)

    def tenant_label(self, tenant: str) -> str:
        """A tenant's name in figures and metric labels: configured tenants by name, the rest
        as ``other`` (bounded label sets)."""
        return tenant if tenant in self.config.tenants else "other"

    def _tenant_allows(self, request: FlowRequest, now_s: float) -> bool:
        limits = self._limits(request.tenant)
        if not limited(limits):
            return True
        return self._tenants.state(request.tenant, limits, now_s).allows(now_s)
