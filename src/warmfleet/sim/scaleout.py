"""The scale-out fleet of the what-if: its parameters, its nodes, and its autoscaler.

``ScaleOut`` is the simulator kernel's ``FleetController`` for the what-if: the first tick places
the floor (``autoscaling.minReplicas``, ready at once), and every ``sync_period_s`` until the
burst ends it runs ``warmfleet.control.autoscaler.recommend`` on the fleet's in-flight total and
places the replicas it adds with ``warmfleet.control.placement.choose_nodes`` (warm nodes first,
one replica per node). A new replica becomes ready after

    image_s + weights_s + engine_init_s

where, on a node without the cache, image_s = ``image_pull_cold_s`` and weights_s =
model_bytes / origin rate, and on a node with it image_s = ``image_pull_cold_s`` x (1 -
``image_pull_reduction``) and weights_s = model_bytes / ``nvme_bytes_per_s``. AWS's figures are
the defaults: 145 GB "20+ min" from S3 (so the origin rate is 145 GB / 1200 s = 121 MB/s per
node), local NVMe ~7 GB/s, image pull 5-7 min (6 min) and "up to 97 %" less with the image cache.
``engine_init_s`` (CUDA graphs, KV profiling) is our assumption; AWS publishes none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from warmfleet.api.names import READY_VALUE, image_label, weights_label
from warmfleet.api.resources import AutoscalingSpec
from warmfleet.api.trace_format import MAX_INSTANCES, MAX_TOKENS
from warmfleet.control.autoscaler import AutoscalerState, recommend
from warmfleet.control.observed import ObservedNode
from warmfleet.control.placement import choose_nodes, preferences
from warmfleet.core.config import StrictModel
from warmfleet.sim.fleet import FleetView, Join
from warmfleet.sim.workloads.synthetic import MAX_REQUESTS

Scenario = Literal["cold", "weights", "weights+image"]
SCENARIOS: tuple[Scenario, ...] = ("cold", "weights", "weights+image")
_CACHE = "whatif"
MAX_RATE_RPS = 10_000.0  # the burst's requests are all built up front
MAX_CALIBRATION_REQUESTS = 10_000
FleetSize = Annotated[int, Field(ge=1, le=1_000_000)]  # nodes of a peer-distribution case


class WhatIfParams(StrictModel):
    """The what-if's parameters (``fleet whatif --params``: a YAML mapping of these, camelCase).
    Counts and rates have upper bounds, so a typo cannot build millions of requests."""

    model_bytes: float = Field(145e9, gt=0)
    origin_reference_s: float = Field(1200.0, gt=0, description="AWS: 145 GB from S3 '20+ min'")
    origin_reference_bytes: float = Field(145e9, gt=0)
    nvme_bytes_per_s: float = Field(7e9, gt=0)
    image_pull_cold_s: float = Field(360.0, ge=0, description="AWS: 5-7 min")
    image_pull_reduction: float = Field(0.97, ge=0, le=1, description="AWS: up to 97 %")
    engine_init_s: float = Field(30.0, ge=0)
    nodes_total: int = Field(12, ge=1, le=MAX_INSTANCES)
    warm_nodes: int = Field(6, ge=0, le=MAX_INSTANCES, validate_default=True)
    engine_preset: str = "llama-3.1-70b-p5"
    base_rate_rps: float = Field(6.0, gt=0, le=MAX_RATE_RPS)
    burst_rate_rps: float = Field(30.0, gt=0, le=MAX_RATE_RPS)
    burst_start_s: float = Field(120.0, ge=0, le=86_400)  # bounds the simulated time
    burst_duration_s: float = Field(1800.0, gt=0, le=86_400, validate_default=True)
    prompt_tokens: int = Field(2048, ge=16, le=MAX_TOKENS)
    output_tokens: int = Field(512, ge=1, le=MAX_TOKENS)
    sync_period_s: float = Field(15.0, ge=1.0, le=3600)
    autoscaling: AutoscalingSpec = Field(
        default_factory=lambda: AutoscalingSpec(
            enabled=True, min_replicas=2, max_replicas=12, target_in_flight_per_replica=48.0
        )
    )
    target_utilization: float | None = Field(
        0.8, gt=0, le=1, description="autoscaler target in flight = this x replica slots"
    )
    calibration_requests: int = Field(400, ge=10, le=MAX_CALIBRATION_REQUESTS)
    seed: int = 0
    # peer distribution (sim.peer_model)
    fleet_sizes: tuple[FleetSize, ...] = Field((4, 20, 100), min_length=1, max_length=64)
    peer_serve_bytes_per_s: float = Field(
        1.25e9, gt=0, description="upload a node gives its peers (10 Gb/s of its NIC)"
    )
    origin_fetches: int = Field(
        1, ge=1, le=MAX_INSTANCES, description="k: origin copies of each piece"
    )

    @model_validator(mode="after")
    def _at_least_one_replica(self) -> WhatIfParams:
        if self.autoscaling.min_replicas < 1:
            raise ValueError("autoscaling.minReplicas must be >= 1 (someone has to take traffic)")
        return self

    @field_validator("warm_nodes")
    @classmethod
    def _warm_within_total(cls, warm: int, info: ValidationInfo) -> int:
        total = info.data.get("nodes_total")
        if total is not None and warm > total:
            raise ValueError(f"{warm} warm nodes, more than nodesTotal ({total})")
        return warm

    @field_validator("burst_duration_s")
    @classmethod
    def _bounded_requests(cls, duration_s: float, info: ValidationInfo) -> float:
        base = info.data.get("base_rate_rps")
        burst = info.data.get("burst_rate_rps")
        start_s = info.data.get("burst_start_s")
        if base is None or burst is None or start_s is None:
            return duration_s  # a bad rate or start is reported on its own
        expected = float(base) * float(start_s) + float(burst) * duration_s
        if expected > MAX_REQUESTS:
            raise ValueError(
                f"about {expected:,.0f} requests (burstRateRps x burstDurationS + baseRateRps x "
                f"burstStartS), more than {MAX_REQUESTS:,}"
            )
        return duration_s

    @property
    def origin_bytes_per_s(self) -> float:
        return self.origin_reference_bytes / self.origin_reference_s

    def start_s(self, weights_cached: bool, image_cached: bool) -> float:
        image_s = self.image_pull_cold_s * ((1 - self.image_pull_reduction) if image_cached else 1)
        rate = self.nvme_bytes_per_s if weights_cached else self.origin_bytes_per_s
        return image_s + self.model_bytes / rate + self.engine_init_s


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


def rate_rps(p: WhatIfParams, t: float) -> float:
    """The offered load at ``t``: the burst rate during the burst, else the base rate."""
    burst = p.burst_start_s <= t < p.burst_start_s + p.burst_duration_s
    return p.burst_rate_rps if burst else p.base_rate_rps


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica the autoscaler started: where, whether its node was prepared, when ready."""

    name: str
    node: str
    prepared: bool
    ready_s: float


class ScaleOut:
    """The autoscaler and its placement, as the kernel's ``FleetController`` (module docstring);
    ``replicas``, ``timeline`` (t, wanted, ready) and ``start_kinds`` are what it did."""

    def __init__(self, params: WhatIfParams, scenario: Scenario) -> None:
        self._p = params
        self.nodes = _nodes(params, scenario)
        self._by_name = {n.name: n for n in self.nodes}
        self._prefs = preferences(_CACHE, _CACHE if scenario == "weights+image" else None)
        self.replicas: list[Replica] = []
        self._state = AutoscalerState()
        self.timeline: list[tuple[float, int, int]] = []  # (t, wanted, ready)
        self.start_kinds: dict[str, float] = {}

    @property
    def period_s(self) -> float:
        return self._p.sync_period_s

    @property
    def until_s(self) -> float:
        return self._p.burst_start_s + self._p.burst_duration_s

    def tick(self, fleet: FleetView) -> list[Join]:
        now_s, scaling = fleet.now_s, self._p.autoscaling
        joins = [] if self.replicas else self._place(scaling.min_replicas, now_s, instant=True)
        current = len(self.replicas)
        rec = recommend(scaling, current, fleet.in_flight_requests, now_s, self._state)
        self._state = rec.state
        if rec.replicas > current:
            joins += self._place(rec.replicas - current, now_s)
        ready = sum(1 for r in self.replicas if r.ready_s <= now_s)
        self.timeline.append((now_s, rec.replicas, ready))
        return joins

    def _place(self, count: int, now_s: float, *, instant: bool = False) -> list[Join]:
        joins = []
        load = {r.node: 1 for r in self.replicas}
        for placement in choose_nodes(count, self.nodes, self._prefs, load):
            labels = self._by_name[placement.node].labels
            image_cached = labels.get(image_label(_CACHE)) == READY_VALUE
            start = self._p.start_s(placement.prepared, image_cached)
            kind = "cold" if not placement.prepared else ("warm" if image_cached else "weights")
            self.start_kinds[kind] = round(start, 1)
            ready_in_s = 0.0 if instant else start
            name = f"r{len(self.replicas)}"
            self.replicas.append(
                Replica(name, placement.node, placement.prepared, now_s + ready_in_s)
            )
            joins.append(Join(ready_in_s, name))
        return joins
