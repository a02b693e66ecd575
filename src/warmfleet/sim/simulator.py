"""Discrete-event, virtual-time fleet simulator (pure, deterministic per seed; docs/simulator.md).

N instances sit behind ONE ``Strategy`` object (the same classes the gateway runs), or behind
several gateway replicas exchanging notes with a delay (``sim.gateways``). A request arrives,
the strategy chooses an instance from a ``FleetSnapshot`` (in-flight load as its replica sees
it; queue, KV usage and capacity read from the instances, polled: ``sim.fleet.EnginePolls``),
the request reaches the instance ``router_overhead_s`` later, which reports its first token and
its end. ``placements`` (index -> instance id, ``sim.placements``) replay it while routable.

Scale events add an instance (empty cache) or remove one, which **drains** (no request is
rerouted or lost). A ``FleetController`` (an autoscaler), called every ``period_s``, starts
instances that join at their ready time; a request arriving while none is ready waits for the
first. With ``flow`` (a ``FlowGate``, ``sim.flowing``) every arrival is routed, queued or shed
by the gate. With ``config.kv_events`` the engines' KV events reach every replica's exact index
after a delay (``sim.kv_feed``). A session's turn waits for its previous turn's end (open loop:
at ``max(arrival, previous end)``); in closed loop ``concurrency`` clients run one session each.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from warmfleet.core.types import Decision, FleetSnapshot, InstanceId, Reason, RoutingKey
from warmfleet.engine.events import EngineEvent, EngineEventKind, EngineRequest
from warmfleet.engine.model import EngineModel
from warmfleet.flow.gate import FlowGate
from warmfleet.routing.base import Strategy, engine_stats_interval_of, kv_event_sink_of
from warmfleet.routing.replicas import ReplicaView
from warmfleet.sim.fleet import (
    EnginePolls,
    FleetController,
    FleetView,
    Join,
    Server,
    fleet_snapshot,
    record_reuse,
)
from warmfleet.sim.flowing import SimFlow
from warmfleet.sim.gateways import Gateways
from warmfleet.sim.kv_feed import KvEventFeed
from warmfleet.sim.records import (
    JoinRecord,
    RequestRecord,
    ScaleEvent,
    ScaleRecord,
    SimConfig,
    SimResult,
    continuation_blocks,
    plan_sessions,
)
from warmfleet.sim.workloads.base import WorkloadRequest

__all__ = [
    "RequestRecord",
    "ScaleEvent",
    "ScaleRecord",
    "SimConfig",
    "SimResult",
    "Simulator",
    "continuation_blocks",
]

_ARRIVAL, _SUBMIT, _SCALE, _TICK, _READY, _SYNC, _FLOW, _KV = 0, 1, 2, 3, 4, 5, 6, 7


class Simulator:
    """Run ``requests`` (with their routing ``keys``) through ``strategy`` on a simulated fleet.

    ``strategy``: one strategy (one gateway), or ``Gateways`` (several replicas in sync).
    ``servers`` builds each instance (default: an ``EngineModel`` of ``config.engine``);
    ``controller`` starts instances during the run (see the module docstring); ``on_finished``
    is called each time a request finishes or is rejected.
    """

    def __init__(
        self,
        config: SimConfig,
        strategy: Strategy | Gateways,
        requests: Sequence[WorkloadRequest],
        keys: Sequence[RoutingKey],
        *,
        servers: Callable[[], Server] | None = None,
        controller: FleetController | None = None,
        on_finished: Callable[[], None] | None = None,
        flow: FlowGate | None = None,
        placements: Mapping[int, InstanceId] | None = None,
    ) -> None:
        if len(requests) != len(keys):
            raise ValueError("one routing key per request")
        if placements and flow is not None:
            raise ValueError("placements are replayed without flow control")
        if flow is not None and isinstance(strategy, Gateways) and len(strategy.views) != 1:
            raise ValueError("flow control runs with one gateway replica")
        if config.instances < 1 and controller is None:
            raise ValueError("no instance and no fleet controller to start one")
        if config.kv_events is not None and servers is not None:
            raise ValueError("KV events come from the engine model: no other servers")
        self._config = config
        self._gateways = strategy if isinstance(strategy, Gateways) else Gateways([strategy])
        self._requests, self._keys = requests, keys
        self._servers = servers  # (not a bound method of self: a cycle kept each run's engines)
        self._controller = controller
        self._on_finished = on_finished  # called as each request finishes (a progress display)
        self._block_tokens = config.engine.block_tokens
        self._engines: dict[InstanceId, Server] = {}
        self._active: list[InstanceId] = []
        self._starting = 0  # started by the controller, not ready yet
        self._waiting: deque[int] = deque()  # arrived while no instance was ready
        # true in-flight requests (drains, the controller); strategies see their replica's
        self._in_flight_requests: dict[InstanceId, int] = {}
        self._heap: list[tuple[float, int, int, int, InstanceId]] = []
        self._counter = itertools.count()
        self._records = [
            RequestRecord(i, r.prompt_tokens, r.output_tokens) for i, r in enumerate(requests)
        ]
        self._next_turn: dict[int, int] = {}  # request index -> next turn of its session
        self._units: deque[int] = deque()  # closed loop: first turns not started yet
        self._now_s, self._time_ok = 0.0, True
        self._scale_records: list[ScaleRecord] = []
        self._joins: list[JoinRecord] = []
        self._created_ids: list[InstanceId] = []
        self._output_hashes: list[tuple[int, ...]] = []
        self._fleet_version = 0  # bumped whenever an engine is created or deleted
        self._flow = None if flow is None else SimFlow(flow, requests, keys, self._records)
        self._placed = placements or {}
        kv, sinks = config.kv_events, [kv_event_sink_of(v.strategy) for v in self._gateways.views]
        self._kv = None if kv is None else KvEventFeed(kv, sinks)
        poll_s = engine_stats_interval_of(self._gateways.views[0].strategy)
        self._polls = None if poll_s is None else EnginePolls(poll_s)  # engines' metrics

    # ------------------------------------------------------------------ setup

    def _new_id(self) -> InstanceId:
        instance_id = f"i{len(self._created_ids)}"
        self._created_ids.append(instance_id)
        return instance_id

    def _activate(self, instance_id: InstanceId) -> None:
        self._engines[instance_id] = self._engine(instance_id)
        self._fleet_version += 1
        self._active.append(instance_id)
        self._in_flight_requests[instance_id] = 0

    def _engine(self, instance_id: InstanceId) -> Server:
        if self._servers is not None:
            return self._servers()
        listener = None if self._kv is None else self._kv.listener(instance_id)
        return EngineModel(self._config.engine, block_listener=listener)

    def _push(self, at_s: float, kind: int, index: int, instance_id: InstanceId = "") -> None:
        heapq.heappush(self._heap, (at_s, next(self._counter), kind, index, instance_id))

    # ------------------------------------------------------------------ run

    def run(self) -> SimResult:
        for _ in range(self._config.instances):
            self._activate(self._new_id())
        self._gateways.on_instances_changed(list(self._active))
        self._next_turn, firsts = plan_sessions(self._requests)  # first turns, in arrival order
        self._output_hashes = continuation_blocks(
            self._keys, self._requests, self._next_turn, self._block_tokens
        )
        if self._controller is not None:
            self._push(0.0, _TICK, 0)  # before any arrival at time 0
        if self._config.concurrency is None:
            for index in firsts:
                self._push(self._requests[index].arrival_s, _ARRIVAL, index)
        else:
            self._units.extend(firsts)
            for _ in range(min(self._config.concurrency, len(self._units))):
                self._push(0.0, _ARRIVAL, self._units.popleft())
        for index, event in enumerate(self._config.scale_events):
            self._push(event.at_s, _SCALE, index)
        self._loop()
        return SimResult(
            self._records,
            list(self._created_ids),
            self._scale_records,
            self._now_s,
            self._time_ok,
            self._output_hashes,
            self._joins,
        )

    def _loop(self) -> None:
        engines = list(self._engines.items())
        known = self._fleet_version
        while True:
            if self._fleet_version != known:
                engines = list(self._engines.items())
                known = self._fleet_version
            best_s: float | None = None
            best: tuple[InstanceId, Server] | None = None
            for item in engines:
                at_s = item[1].next_event_s()
                if at_s is not None and (best_s is None or at_s < best_s):
                    best_s, best = at_s, item
            heap_s = self._heap[0][0] if self._heap else None
            if best is not None and best_s is not None and (heap_s is None or best_s <= heap_s):
                self._set_now(best_s)
                for event in best[1].advance(best_s):
                    self._on_engine_event(best[0], event)
            elif heap_s is not None:
                at_s, _, kind, index, instance_id = heapq.heappop(self._heap)
                self._set_now(at_s)
                self._dispatch(kind, index, instance_id)
            else:
                return
            if self._kv is not None and (arrives_s := self._kv.flush(self._now_s)) is not None:
                self._push(arrives_s, _KV, 0)
            if self._config.check_invariants:
                for _, engine in engines:
                    engine.check_invariants()

    def _dispatch(self, kind: int, index: int, instance_id: InstanceId) -> None:
        if kind == _ARRIVAL:
            self._arrive(index)
        elif kind == _SUBMIT:
            self._submit(index, instance_id)
        elif kind == _SCALE:
            self._scale(self._config.scale_events[index])
        elif kind == _TICK:
            self._tick()
        elif kind == _SYNC:
            self._gateways.deliver()
        elif kind == _FLOW:
            self._drain_flow(timer=True)
        elif kind == _KV:
            if self._kv is not None:  # (only a feed pushes these)
                self._kv.deliver(self._now_s, self._active.__contains__)  # (routable)
        else:
            self._ready(instance_id)

    def _set_now(self, now_s: float) -> None:
        if now_s < self._now_s:
            self._time_ok = False
        if self._polls is not None:  # before the events at now_s change the engines
            self._polls.advance(now_s, self._engines)
        self._now_s = max(self._now_s, now_s)

    # ------------------------------------------------------------------ handlers

    def _snapshot(self, view: ReplicaView) -> FleetSnapshot:
        """The fleet as ``view``'s replica sees it (its in-flight counts, the engines' stats)."""
        return fleet_snapshot(self._active, self._engines, view, self._now_s, self._polls)

    def _arrive(self, index: int) -> None:
        self._records[index].arrival_s = self._now_s
        if self._flow is not None:
            self._drain_flow(admit=index)
        elif self._active:
            self._route(index)
        else:
            self._waiting.append(index)

    def _drain_flow(self, *, admit: int | None = None, timer: bool = False) -> None:
        """Flow control: submit ``admit`` (an arrival), then act on every outcome due now."""
        if self._flow is not None:
            view = self._gateways.pick()
            due_s = self._flow.drain(
                lambda: self._snapshot(view), self._route, self._unserved, admit, timer=timer
            )
            if due_s is not None:
                self._push(due_s, _FLOW, 0)

    def _unserved(self, index: int) -> None:
        """Flow control shed request ``index`` (its record says so): its session goes on."""
        self._release_next(index)
        if self._on_finished is not None:
            self._on_finished()

    def _route(self, index: int, decided: Decision | None = None) -> None:
        key = self._keys[index]
        record = self._records[index]
        view = self._gateways.pick()
        placed = self._placed.get(index)  # a replayed placement, taken while routable
        if decided is None and placed is not None and placed in self._active:
            decided = Decision(placed, Reason.REPLAYED)
        decision = decided or view.strategy.choose(key, self._snapshot(view))
        self._sync_at(self._gateways.routed(view, index, key, decision, self._now_s))
        chosen = decision.instance_id
        if key.block_hashes:  # else nothing can be cached: both stay 0
            record_reuse(
                record,
                key.block_hashes,
                chosen,
                active=self._active,
                servers=self._engines,
                block_tokens=self._block_tokens,
            )
        record.instance_id = chosen
        record.reason = str(decision.reason)
        record.spilled = decision.spilled
        self._in_flight_requests[chosen] += 1
        self._push(self._now_s + self._config.router_overhead_s, _SUBMIT, index, chosen)

    def _submit(self, index: int, instance_id: InstanceId) -> None:
        req, hashes = self._requests[index], self._keys[index].block_hashes
        engine_req = EngineRequest(
            index, hashes, req.prompt_tokens, req.output_tokens, self._output_hashes[index]
        )
        self._engines[instance_id].submit(engine_req, self._now_s)

    def _on_engine_event(self, instance_id: InstanceId, event: EngineEvent) -> None:
        record = self._records[event.request_id]
        if event.kind == EngineEventKind.FIRST_TOKEN:
            record.first_token_s = event.time_s
            record.cached_tokens = event.cached_tokens
            if self._flow is not None:
                self._flow.gate.on_first_token(event.request_id, event.time_s)
            return
        if event.kind == EngineEventKind.TOKEN:
            return
        record.finish_s = event.time_s
        record.rejected = event.kind == EngineEventKind.REJECTED
        self._in_flight_requests[instance_id] -= 1
        self._sync_at(self._gateways.finished(event.request_id, self._now_s))
        self._release_next(event.request_id)
        if self._on_finished is not None:
            self._on_finished()
        self._drop_if_drained(instance_id)
        if self._flow is not None:
            self._flow.gate.on_finished(event.request_id, event.time_s)
            self._drain_flow()

    def _sync_at(self, at_s: float | None) -> None:
        if at_s is not None:
            self._push(at_s, _SYNC, 0)

    def _release_next(self, index: int) -> None:
        nxt = self._next_turn.get(index)
        if nxt is not None:
            if self._config.concurrency is None:
                self._push(max(self._requests[nxt].arrival_s, self._now_s), _ARRIVAL, nxt)
            else:
                self._push(self._now_s, _ARRIVAL, nxt)
        elif self._config.concurrency is not None and self._units:
            self._push(self._now_s, _ARRIVAL, self._units.popleft())

    def _scale(self, event: ScaleEvent) -> None:
        before = tuple(self._active)
        if event.action == "add":
            self._activate(self._new_id())
        else:
            victim = event.instance_id or (self._active[-1] if self._active else None)
            if victim is None or victim not in self._active or len(self._active) == 1:
                return  # never remove the last instance
            self._active.remove(victim)
            self._drop_if_drained(victim)
        self._changed(before)

    def _drop_if_drained(self, instance_id: InstanceId) -> None:
        if instance_id not in self._active and self._in_flight_requests[instance_id] == 0:
            del self._engines[instance_id]  # removed, and its last request done
            self._fleet_version += 1

    def _changed(self, before: tuple[InstanceId, ...]) -> None:
        self._gateways.on_instances_changed(list(self._active))
        self._scale_records.append(ScaleRecord(self._now_s, before, tuple(self._active)))

    # ------------------------------------------------------------------ fleet controller

    def _tick(self) -> None:
        controller = self._controller
        if controller is None or self._now_s >= controller.until_s:
            return
        view = FleetView(
            self._now_s,
            replicas=len(self._active) + self._starting,
            ready=len(self._active),
            in_flight_requests=sum(self._in_flight_requests.values())
            + len(self._waiting)
            + (self._flow.gate.demand() if self._flow is not None else 0),
        )
        for join in controller.tick(view):
            self._start(join)
        self._push(self._now_s + controller.period_s, _TICK, 0)

    def _start(self, join: Join) -> None:
        instance_id = self._new_id()
        ready_s = self._now_s + max(join.ready_in_s, 0.0)
        self._joins.append(JoinRecord(instance_id, self._now_s, ready_s, join.tag))
        self._starting += 1
        if join.ready_in_s <= 0:
            self._ready(instance_id)
        else:
            self._push(ready_s, _READY, 0, instance_id)

    def _ready(self, instance_id: InstanceId) -> None:
        """A started instance takes traffic; requests waiting for one are routed now."""
        self._starting -= 1
        before = tuple(self._active)
        self._activate(instance_id)
        self._changed(before)
        self._drain_flow()
        while self._waiting:
            self._route(self._waiting.popleft())
