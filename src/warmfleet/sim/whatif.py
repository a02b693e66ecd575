"""Scale-out what-if: a traffic burst with autoscaling, cold vs weights-cached vs weights+image.

Pure and deterministic for a seed. Virtual time; every replica is an ``EngineModel`` (the same
vLLM-like engine model the fleet simulator uses, ``llama-3.1-70b-p5`` preset by default: 141 GB of
BF16 weights, AWS's "145 GB" example), requests go to the ready replica with the fewest requests
in flight (the gateway's least-outstanding rule), and the autoscaler is
``warmfleet.control.autoscaler.recommend`` run every ``sync_period_s`` on the in-flight total.

A new replica is placed with ``warmfleet.control.placement.choose_nodes`` (warm nodes first, one
replica per node) and becomes ready after

    image_s + weights_s + engine_init_s

where, on a node without the cache, image_s = ``image_pull_cold_s`` and weights_s =
model_bytes / origin rate, and on a node with it image_s = ``image_pull_cold_s`` x (1 -
``image_pull_reduction``) and weights_s = model_bytes / ``nvme_bytes_per_s``. AWS's figures are
the defaults: 145 GB "20+ min" from S3 (so the origin rate is 145 GB / 1200 s = 121 MB/s per
node), local NVMe ~7 GB/s, image pull 5-7 min (6 min) and "up to 97 %" less with the image cache.
``engine_init_s`` (CUDA graphs, KV profiling) is our assumption; AWS publishes none.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field, model_validator

from warmfleet.api.names import READY_VALUE, image_label, weights_label
from warmfleet.api.resources import AutoscalingSpec
from warmfleet.control.autoscaler import AutoscalerState, recommend
from warmfleet.control.observed import ObservedNode
from warmfleet.control.placement import choose_nodes, preferences
from warmfleet.core.config import StrictModel
from warmfleet.engine.events import EngineEventKind, EngineRequest
from warmfleet.engine.model import EngineModel
from warmfleet.engine.presets import get_preset
from warmfleet.sim.metrics import percentile

Scenario = Literal["cold", "weights", "weights+image"]
SCENARIOS: tuple[Scenario, ...] = ("cold", "weights", "weights+image")
_CACHE = "whatif"


class WhatIfParams(StrictModel):
    model_bytes: float = Field(145e9, gt=0)
    origin_reference_s: float = Field(1200.0, gt=0, description="AWS: 145 GB from S3 '20+ min'")
    origin_reference_bytes: float = Field(145e9, gt=0)
    nvme_bytes_per_s: float = Field(7e9, gt=0)
    image_pull_cold_s: float = Field(360.0, ge=0, description="AWS: 5-7 min")
    image_pull_reduction: float = Field(0.97, ge=0, le=1, description="AWS: up to 97 %")
    engine_init_s: float = Field(30.0, ge=0)
    nodes_total: int = Field(12, ge=1)
    warm_nodes: int = Field(6, ge=0)
    engine_preset: str = "llama-3.1-70b-p5"
    base_rate_rps: float = Field(6.0, gt=0)
    burst_rate_rps: float = Field(30.0, gt=0)
    burst_start_s: float = Field(120.0, ge=0)
    burst_duration_s: float = Field(1800.0, gt=0)
    prompt_tokens: int = Field(2048, ge=16)
    output_tokens: int = Field(512, ge=1)
    sync_period_s: float = Field(15.0, gt=0)
    autoscaling: AutoscalingSpec = Field(
        default_factory=lambda: AutoscalingSpec(
            enabled=True, min_replicas=2, max_replicas=12, target_in_flight_per_replica=48.0
        )
    )
    target_utilization: float | None = Field(
        0.8, gt=0, le=1, description="autoscaler target in flight = this x replica slots"
    )
    calibration_requests: int = Field(400, ge=10)
    seed: int = 0

    @model_validator(mode="after")
    def _at_least_one_replica(self) -> WhatIfParams:
        if self.autoscaling.min_replicas < 1:
            raise ValueError("autoscaling.minReplicas must be >= 1 (someone has to take traffic)")
        return self

    @property
    def origin_bytes_per_s(self) -> float:
        return self.origin_reference_bytes / self.origin_reference_s

    def start_s(self, weights_cached: bool, image_cached: bool) -> float:
        image_s = self.image_pull_cold_s * ((1 - self.image_pull_reduction) if image_cached else 1)
        rate = self.nvme_bytes_per_s if weights_cached else self.origin_bytes_per_s
        return image_s + self.model_bytes / rate + self.engine_init_s


@dataclass(slots=True)
class ScenarioResult:
    scenario: Scenario
    replica_start_s: dict[str, float]
    weights_load_s: dict[str, float]
    time_to_first_new_replica_s: float | None
    time_to_capacity_s: float | None  # ready replicas x capacity >= burst rate
    replicas_needed: int
    peak_wanted_replicas: int
    time_to_peak_replicas_s: float | None  # ready replicas >= the autoscaler's peak
    ttft_p50_ms: float
    ttft_p95_ms: float
    ttft_p99_ms: float
    burst_requests: int
    unprepared_request_share: float
    unprepared_replica_share: float
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (t, wanted, ready)

    def report(self) -> dict[str, object]:
        return {
            "replica_start_s": self.replica_start_s,
            "weights_load_s": self.weights_load_s,
            "time_to_first_new_replica_s": self.time_to_first_new_replica_s,
            "time_to_capacity_s": self.time_to_capacity_s,
            "replicas_needed": self.replicas_needed,
            "peak_wanted_replicas": self.peak_wanted_replicas,
            "time_to_peak_replicas_s": self.time_to_peak_replicas_s,
            "ttft_p50_ms": self.ttft_p50_ms,
            "ttft_p95_ms": self.ttft_p95_ms,
            "ttft_p99_ms": self.ttft_p99_ms,
            "burst_requests": self.burst_requests,
            "unprepared_request_share": self.unprepared_request_share,
            "unprepared_replica_share": self.unprepared_replica_share,
        }


def _nodes(params: WhatIfParams, scenario: Scenario) -> list[ObservedNode]:
    nodes = []
    for i in range(params.nodes_total):
        labels: dict[str, str] = {}
        if scenario != "cold" and i < params.warm_nodes:
            labels[weights_label(_CACHE)] = READY_VALUE
            if scenario == "weights+image":
                labels[image_label(_CACHE)] = READY_VALUE
        nodes.append(ObservedNode(f"node-{i:02d}", labels=labels))
    return nodes


@dataclass(frozen=True, slots=True)
class ReplicaModel:
    """One replica as an M/D/c server calibrated on the engine model.

    ``slots`` concurrent requests (vLLM's max_num_seqs, or fewer if the KV cache holds fewer
    requests of this shape), each holding its slot for ``slots / capacity_rps`` seconds, where
    ``capacity_rps`` is the engine model's saturated throughput. A request that gets a slot has its
    first token after a TTFT drawn from ``ttft_samples_s`` (the engine model's TTFTs at 70 % load);
    a request that waits for a slot adds the wait.
    """

    slots: int
    capacity_rps: float
    ttft_samples_s: tuple[float, ...]

    @property
    def service_s(self) -> float:
        return self.slots / self.capacity_rps


def _drive(
    engine: EngineModel, arrivals: Sequence[float], rng: random.Random, p: WhatIfParams
) -> dict[int, tuple[float, float]]:
    """Submit one request per arrival time; return request -> (first_token_s, finish_s)."""
    blocks = p.prompt_tokens // engine.spec.block_tokens
    out: dict[int, tuple[float, float]] = {}
    first: dict[int, float] = {}
    pending = list(enumerate(arrivals))
    while pending or engine.next_event_s() is not None:
        nxt = engine.next_event_s()
        if pending and (nxt is None or pending[0][1] <= nxt):
            rid, at = pending.pop(0)
            hashes = tuple(rng.getrandbits(63) for _ in range(blocks))
            engine.submit(EngineRequest(rid, hashes, p.prompt_tokens, p.output_tokens), at)
            continue
        assert nxt is not None
        for event in engine.advance(nxt):
            if event.kind == EngineEventKind.FIRST_TOKEN:
                first[event.request_id] = event.time_s
            elif event.kind == EngineEventKind.FINISHED:
                out[event.request_id] = (first[event.request_id], event.time_s)
    return out


def calibrate(params: WhatIfParams) -> ReplicaModel:
    """Saturated throughput and loaded TTFTs of one replica, from the engine model."""
    spec = get_preset(params.engine_preset)
    rng = random.Random(params.seed)
    slots = max(
        1,
        min(
            spec.max_num_seqs,
            spec.kv_capacity_tokens // (params.prompt_tokens + params.output_tokens),
        ),
    )
    total = 3 * slots
    done = _drive(EngineModel(spec), [0.0] * total, rng, params)
    finishes = sorted(f for _, f in done.values())
    capacity = (total - slots) / (finishes[-1] - finishes[slots - 1])
    arrivals, t = [], 0.0
    for _ in range(params.calibration_requests):
        t += rng.expovariate(0.7 * capacity)
        arrivals.append(t)
    loaded = _drive(EngineModel(spec), arrivals, rng, params)
    samples = tuple(sorted(loaded[i][0] - arrivals[i] for i in loaded))
    return ReplicaModel(slots=slots, capacity_rps=capacity, ttft_samples_s=samples)


@dataclass(slots=True)
class _Replica:
    name: str
    node: str
    prepared: bool
    ready_s: float
    busy: int = 0
    queue: deque[tuple[int, float]] = field(default_factory=deque)

    @property
    def in_flight(self) -> int:
        return self.busy + len(self.queue)


_ARRIVE, _FINISH, _TICK = 0, 1, 2


class _Run:
    def __init__(self, params: WhatIfParams, scenario: Scenario, model: ReplicaModel) -> None:
        self.p, self.scenario, self.model = params, scenario, model
        self.rng = random.Random(params.seed)
        self.nodes = _nodes(params, scenario)
        self.by_name = {n.name: n for n in self.nodes}
        self.prefs = preferences(_CACHE, _CACHE if scenario == "weights+image" else None)
        self.replicas: list[_Replica] = []
        self.state = AutoscalerState()
        self.heap: list[tuple[float, int, int, int]] = []
        self.counter = itertools.count()
        self.arrival_s: dict[int, float] = {}
        self.owner: dict[int, _Replica] = {}
        self.ttft_s: dict[int, float] = {}
        self.timeline: list[tuple[float, int, int]] = []
        self.start_kinds: dict[str, float] = {}

    def _push(self, at_s: float, kind: int, index: int = 0) -> None:
        heapq.heappush(self.heap, (at_s, next(self.counter), kind, index))

    def _start_replicas(self, count: int, now_s: float, *, instant: bool = False) -> None:
        load = {r.node: 1 for r in self.replicas}
        for placement in choose_nodes(count, self.nodes, self.prefs, load):
            image_cached = (
                self.by_name[placement.node].labels.get(image_label(_CACHE)) == READY_VALUE
            )
            start = self.p.start_s(placement.prepared, image_cached)
            kind = "cold" if not placement.prepared else ("warm" if image_cached else "weights")
            self.start_kinds[kind] = round(start, 1)
            ready = now_s if instant else now_s + start
            self.replicas.append(
                _Replica(f"r{len(self.replicas)}", placement.node, placement.prepared, ready)
            )

    def _rate(self, t: float) -> float:
        burst = self.p.burst_start_s <= t < self.p.burst_start_s + self.p.burst_duration_s
        return self.p.burst_rate_rps if burst else self.p.base_rate_rps

    def _begin(self, replica: _Replica, request_id: int, waited_s: float, now_s: float) -> None:
        replica.busy += 1
        self.ttft_s[request_id] = waited_s + self.rng.choice(self.model.ttft_samples_s)
        self._push(now_s + self.model.service_s, _FINISH, self.replicas.index(replica))

    def _arrive(self, request_id: int, now_s: float) -> None:
        ready = [r for r in self.replicas if r.ready_s <= now_s]
        target = min(ready, key=lambda r: (r.in_flight, r.name))
        self.owner[request_id] = target
        self.arrival_s[request_id] = now_s
        if target.busy < self.model.slots:
            self._begin(target, request_id, 0.0, now_s)
        else:
            target.queue.append((request_id, now_s))

    def _finish(self, index: int, now_s: float) -> None:
        replica = self.replicas[index]
        replica.busy -= 1
        if replica.queue:
            request_id, arrived = replica.queue.popleft()
            self._begin(replica, request_id, now_s - arrived, now_s)

    def _autoscale(self, now_s: float) -> None:
        in_flight = sum(r.in_flight for r in self.replicas)
        rec = recommend(self.p.autoscaling, len(self.replicas), in_flight, now_s, self.state)
        self.state = rec.state
        if rec.replicas > len(self.replicas):
            self._start_replicas(rec.replicas - len(self.replicas), now_s)
        ready = sum(1 for r in self.replicas if r.ready_s <= now_s)
        self.timeline.append((now_s, rec.replicas, ready))

    def run(self) -> ScenarioResult:
        p = self.p
        end_s = p.burst_start_s + p.burst_duration_s
        self._start_replicas(p.autoscaling.min_replicas, 0.0, instant=True)
        self._push(self.rng.expovariate(self._rate(0.0)), _ARRIVE, 0)
        self._push(0.0, _TICK)
        while self.heap:
            now, _, kind, index = heapq.heappop(self.heap)
            if kind == _ARRIVE and now < end_s:
                self._arrive(index, now)
                self._push(now + self.rng.expovariate(self._rate(now)), _ARRIVE, index + 1)
            elif kind == _FINISH:
                self._finish(index, now)
            elif kind == _TICK and now < end_s:
                self._autoscale(now)
                self._push(now + p.sync_period_s, _TICK)
        return self._result()

    def _result(self) -> ScenarioResult:
        p = self.p
        lo, hi = p.burst_start_s, p.burst_start_s + p.burst_duration_s
        burst = [i for i, t in self.arrival_s.items() if lo <= t < hi]
        ttfts = [self.ttft_s[i] for i in burst]
        unprepared = sum(1 for i in burst if not self.owner[i].prepared)
        new = [r for r in self.replicas if r.ready_s > 0]
        peak = max((w for t, w, _ in self.timeline if lo <= t < hi), default=len(self.replicas))
        needed = math.ceil(p.burst_rate_rps / self.model.capacity_rps - 1e-9)
        ready_times = sorted(r.ready_s for r in self.replicas)
        capacity_at = max(lo, ready_times[needed - 1]) if needed <= len(ready_times) else None
        peak_at = ready_times[peak - 1] if peak <= len(ready_times) else None
        first_new = min((r.ready_s - lo for r in new if r.ready_s >= lo), default=None)
        return ScenarioResult(
            scenario=self.scenario,
            replica_start_s=dict(sorted(self.start_kinds.items())),
            weights_load_s={
                "origin": round(p.model_bytes / p.origin_bytes_per_s, 1),
                "nvme": round(p.model_bytes / p.nvme_bytes_per_s, 1),
            },
            time_to_first_new_replica_s=None if first_new is None else round(first_new, 1),
            time_to_capacity_s=None if capacity_at is None else round(capacity_at - lo, 1),
            replicas_needed=needed,
            peak_wanted_replicas=peak,
            time_to_peak_replicas_s=None if peak_at is None else round(max(0.0, peak_at - lo), 1),
            ttft_p50_ms=round(percentile(ttfts, 50) * 1000, 1),
            ttft_p95_ms=round(percentile(ttfts, 95) * 1000, 1),
            ttft_p99_ms=round(percentile(ttfts, 99) * 1000, 1),
            burst_requests=len(burst),
            unprepared_request_share=round(unprepared / len(burst), 4) if burst else 0.0,
            unprepared_replica_share=(
                round(sum(1 for r in new if not r.prepared) / len(new), 4) if new else 0.0
            ),
            timeline=self.timeline,
        )


def run_scenario(
    params: WhatIfParams, scenario: Scenario, model: ReplicaModel | None = None
) -> ScenarioResult:
    model = model or calibrate(params)
    if params.target_utilization is not None:
        target = max(1.0, params.target_utilization * model.slots)
        scaling = params.autoscaling.model_copy(update={"target_in_flight_per_replica": target})
        params = params.model_copy(update={"autoscaling": scaling})
    return _Run(params, scenario, model).run()


def run_whatif(
    params: WhatIfParams, scenarios: Sequence[Scenario] = SCENARIOS
) -> dict[str, object]:
    """All scenarios with one calibration and seed: the JSON that bench-results/fleet.json holds."""
    model = calibrate(params)
    results = {s: run_scenario(params, s, model) for s in scenarios}
    return {
        "params": params.model_dump(mode="json"),
        "replica_model": {
            "slots": model.slots,
            "capacity_rps": round(model.capacity_rps, 3),
            "service_s": round(model.service_s, 3),
            "ttft_p50_ms_at_70pct_load": round(percentile(model.ttft_samples_s, 50) * 1000, 1),
        },
        "derived": {
            "origin_bytes_per_s": round(params.origin_bytes_per_s),
            "replica_start_s": {
                "cold": round(params.start_s(False, False), 1),
                "weights": round(params.start_s(True, False), 1),
                "weights+image": round(params.start_s(True, True), 1),
            },
        },
        "scenarios": {s: r.report() for s, r in results.items()},
    }
