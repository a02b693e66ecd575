"""Scale-out what-if: a traffic burst with autoscaling, cold vs weights-cached vs weights+image.

Pure and deterministic for a seed, and run on the one simulator kernel (``sim.Simulator``):
requests are routed by the real ``least_outstanding_requests`` strategy built by
``routing.factory`` (the gateway's rule, ties broken by its seeded random), the fleet is started
by ``sim.scaleout.ScaleOut`` (the autoscaler ``warmfleet.control.autoscaler.recommend`` and the
placement, run as the kernel's ``FleetController`` every ``sync_period_s``), and each replica is
a ``SlotServer`` (an M/D/c server) calibrated on ``EngineModel``, the vLLM-like engine model the
fleet simulator uses, itself run on the same kernel (``llama-3.1-70b-p5`` preset by default: 141
GB of BF16 weights, AWS's "145 GB" example). Replica start times and AWS's figures behind them:
``sim.scaleout``. Peer distribution (origin egress and time to capacity with and without
peers at ``fleet_sizes`` nodes): ``sim.peer_model``.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from warmfleet.core.errors import ConfigError
from warmfleet.core.hashing import hash_str
from warmfleet.core.progress import NoProgress, RunProgress
from warmfleet.core.types import RoutingKey
from warmfleet.engine.presets import get_preset
from warmfleet.engine.spec import EngineSpec
from warmfleet.routing.base import Strategy
from warmfleet.routing.factory import build_strategy, strategy_config
from warmfleet.sim.metrics import percentile
from warmfleet.sim.peer_model import peer_whatif
from warmfleet.sim.records import RequestRecord, SimConfig, SimResult
from warmfleet.sim.runner import strategy_rng
from warmfleet.sim.scaleout import SCENARIOS, ScaleOut, Scenario, WhatIfParams, rate_rps
from warmfleet.sim.servers import ReplicaModel, SlotServer
from warmfleet.sim.simulator import Simulator
from warmfleet.sim.workloads.base import Segment, WorkloadRequest

__all__ = [
    "SCENARIOS",
    "ReplicaModel",
    "Scenario",
    "ScenarioResult",
    "WhatIfParams",
    "calibrate",
    "run_scenario",
    "run_whatif",
]

ROUTING = "least_outstanding_requests"  # the gateway's load-only rule


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
    decisions_by_reason: dict[str, int] = field(default_factory=dict)  # routing, not reported

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


def _strategy(name: str, seed: int) -> Strategy:
    """Strategy ``name`` as the fleet simulator builds it (``routing.factory``, seeded alike)."""
    return build_strategy(strategy_config(name), strategy_rng(seed, name))


def _key(hashes: tuple[int, ...], block_tokens: int, index: int, p: WhatIfParams) -> RoutingKey:
    """A unique prompt's key (``index`` is its prefix hash: no two requests share one)."""
    return RoutingKey(
        hashes,
        block_size=block_tokens,
        units=p.prompt_tokens,
        prompt_tokens=p.prompt_tokens,
        prefix_hash=index,
        output_tokens_hint=p.output_tokens,
    )


def _engine_run(
    spec: EngineSpec,
    arrivals: Sequence[float],
    rng: random.Random,
    p: WhatIfParams,
    on_finished: Callable[[], None] | None = None,
) -> list[RequestRecord]:
    """One engine, one request per arrival time (unique prompts): the finished records."""
    blocks = p.prompt_tokens // spec.block_tokens
    requests: list[WorkloadRequest] = []
    keys: list[RoutingKey] = []
    for index, at_s in enumerate(arrivals):
        hashes = tuple(rng.getrandbits(63) for _ in range(blocks))
        segments = (Segment(index, p.prompt_tokens),)
        requests.append(WorkloadRequest(index, at_s, segments, p.output_tokens))
        keys.append(_key(hashes, spec.block_tokens, index, p))
    config = SimConfig(instances=1, engine=spec, router_overhead_s=0.0)
    simulator = Simulator(
        config, _strategy(ROUTING, p.seed), requests, keys, on_finished=on_finished
    )
    result = simulator.run()
    return [r for r in result.records if r.done and not r.rejected]


def _fitting_spec(params: WhatIfParams) -> EngineSpec:
    """The preset's engine, when one request of ``params`` fits it (else nothing completes)."""
    spec = get_preset(params.engine_preset)
    total = params.prompt_tokens + params.output_tokens
    limit = min(spec.max_model_len, spec.kv_capacity_tokens)
    if total > limit:
        raise ConfigError(
            f"promptTokens + outputTokens: {total} tokens, more than one request of "
            f"{params.engine_preset} holds ({limit}: its max_model_len and KV capacity)"
        )
    return spec


def calibrate(params: WhatIfParams, progress: RunProgress | None = None) -> ReplicaModel:
    """Saturated throughput and loaded TTFTs of one replica, from the engine model
    (``progress``: one phase, a unit per calibration request)."""
    spec = _fitting_spec(params)
    progress = progress or NoProgress()
    rng = random.Random(params.seed)
    slots = max(
        1,
        min(
            spec.max_num_seqs,
            spec.kv_capacity_tokens // (params.prompt_tokens + params.output_tokens),
        ),
    )
    total = 3 * slots
    progress.phase("calibrating one replica", total + params.calibration_requests)
    done = _engine_run(spec, [0.0] * total, rng, params, progress.advance)
    finishes = sorted(r.finish_s for r in done)
    capacity = (total - slots) / (finishes[-1] - finishes[slots - 1])
    arrivals, t = [], 0.0
    for _ in range(params.calibration_requests):
        t += rng.expovariate(0.7 * capacity)
        arrivals.append(t)
    loaded = _engine_run(spec, arrivals, rng, params, progress.advance)
    samples = tuple(sorted(r.first_token_s - r.arrival_s for r in loaded))
    return ReplicaModel(slots=slots, capacity_rps=capacity, ttft_samples_s=samples)


def _burst_requests(
    p: WhatIfParams, block_tokens: int
) -> tuple[list[WorkloadRequest], list[RoutingKey]]:
    """Poisson arrivals at the base rate, then the burst rate, until the burst ends; unique
    prompts (the replicas model no prefix cache, so the keys carry no block hashes)."""
    rng = random.Random(p.seed)
    end_s = p.burst_start_s + p.burst_duration_s
    requests: list[WorkloadRequest] = []
    keys: list[RoutingKey] = []
    t = rng.expovariate(rate_rps(p, 0.0))
    while t < end_s:
        index = len(requests)
        segments = (Segment(index, p.prompt_tokens),)
        requests.append(WorkloadRequest(index, t, segments, p.output_tokens))
        keys.append(_key((), block_tokens, index, p))
        t += rng.expovariate(rate_rps(p, t))
    return requests, keys


def _result(
    p: WhatIfParams,
    scenario: Scenario,
    model: ReplicaModel,
    fleet: ScaleOut,
    result: SimResult,
) -> ScenarioResult:
    lo, hi = p.burst_start_s, p.burst_start_s + p.burst_duration_s
    by_name = {r.name: r for r in fleet.replicas}
    owner = {j.instance_id: by_name[j.tag] for j in result.joins}
    burst = [r for r in result.records if lo <= r.arrival_s < hi]
    ttfts = [r.first_token_s - r.arrival_s for r in burst]
    unprepared = sum(1 for r in burst if not owner[r.instance_id].prepared)
    new = [r for r in fleet.replicas if r.ready_s > 0]
    peak = max((w for t, w, _ in fleet.timeline if lo <= t < hi), default=len(fleet.replicas))
    needed = math.ceil(p.burst_rate_rps / model.capacity_rps - 1e-9)
    ready_times = sorted(r.ready_s for r in fleet.replicas)
    capacity_at = max(lo, ready_times[needed - 1]) if needed <= len(ready_times) else None
    peak_at = ready_times[peak - 1] if peak <= len(ready_times) else None
    first_new = min((r.ready_s - lo for r in new if r.ready_s >= lo), default=None)
    return ScenarioResult(
        scenario=scenario,
        replica_start_s=dict(sorted(fleet.start_kinds.items())),
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
        timeline=fleet.timeline,
        decisions_by_reason=dict(sorted(Counter(r.reason for r in result.records).items())),
    )


def run_scenario(
    params: WhatIfParams,
    scenario: Scenario,
    model: ReplicaModel | None = None,
    *,
    routing: str = ROUTING,
    progress: RunProgress | None = None,
) -> ScenarioResult:
    """One scenario on the simulator kernel; ``routing`` names its strategy (routing.factory);
    ``progress``: a phase named after the scenario, a unit per finished request."""
    progress = progress or NoProgress()
    model = model or calibrate(params, progress)
    if params.target_utilization is not None:
        target = max(1.0, params.target_utilization * model.slots)
        scaling = params.autoscaling.model_copy(update={"target_in_flight_per_replica": target})
        params = params.model_copy(update={"autoscaling": scaling})
    spec = get_preset(params.engine_preset)
    requests, keys = _burst_requests(params, spec.block_tokens)
    ttft_rng = random.Random(hash_str("whatif-ttft", params.seed))
    fleet = ScaleOut(params, scenario)
    progress.phase(f"what-if {scenario}", len(requests))
    simulator = Simulator(
        SimConfig(instances=0, engine=spec, router_overhead_s=0.0),
        _strategy(routing, params.seed),
        requests,
        keys,
        servers=lambda: SlotServer(model, ttft_rng),
        controller=fleet,
        on_finished=progress.advance,
    )
    return _result(params, scenario, model, fleet, simulator.run())


def run_whatif(
    params: WhatIfParams,
    scenarios: Sequence[Scenario] = SCENARIOS,
    progress: RunProgress | None = None,
) -> dict[str, object]:
    """All scenarios with one calibration and seed: the JSON that bench-results/fleet.json holds
    (``progress``: the calibration, then a phase per scenario)."""
    model = calibrate(params, progress)
    results = {s: run_scenario(params, s, model, progress=progress) for s in scenarios}
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
        "peer_distribution": peer_whatif(params),
    }
