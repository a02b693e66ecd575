"""The workloads and runs of ``make bench-flow`` (issue 23's acceptance, docs/benchmarks.md).

Pure: builds request lists, runs them through the one simulator with or without flow control
(``warmfleet.flow``'s ``FlowGate`` in front of the same strategy objects), and reduces the
records to per-tenant and per-band figures.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from warmfleet.core.hashing import hash_str
from warmfleet.engine.spec import EngineSpec
from warmfleet.flow.gate import FlowGate
from warmfleet.flow.model import TtftPredictor
from warmfleet.routing.config import StrategyConfig
from warmfleet.routing.factory import build_strategy
from warmfleet.routing.flow_config import FlowControlConfig
from warmfleet.routing.key_spec import DEFAULT_PREFIX_LENGTH
from warmfleet.sim.metrics import percentile
from warmfleet.sim.records import RequestRecord, SimConfig
from warmfleet.sim.runner import prepare, routing_keys, strategy_rng
from warmfleet.sim.simulator import Simulator
from warmfleet.sim.workloads.base import Segment, WorkloadRequest
from warmfleet.sim.workloads.synthetic import MultiRoundQaConfig, multi_round_qa


def conversations(
    tenant: str, seed: int, *, users: int, rounds: int, qps: float, priority: int | None = None
) -> list[WorkloadRequest]:
    """A tenant's multi-round conversations (shared system prompt, private growing history)."""
    config = MultiRoundQaConfig(users=users, rounds=rounds, qps=qps)
    return [
        replace(
            r, tenant=tenant, priority=priority, session_id=hash_str(f"{tenant}:{r.session_id}")
        )
        for r in multi_round_qa(config, hash_str(tenant, seed))
    ]


def cold_stream(
    tenant: str,
    seed: int,
    *,
    rate_rps: float,
    start_s: float,
    duration_s: float,
    prompt_tokens: int,
    output_tokens: int,
    priority: int | None = None,
    deadline_ms: float | None = None,
) -> list[WorkloadRequest]:
    """Poisson arrivals of unique (never cached) prompts between ``start_s`` and its end."""
    rng = random.Random(hash_str(f"cold:{tenant}", seed))
    out: list[WorkloadRequest] = []
    now_s = start_s
    index = 0
    while True:
        now_s += rng.expovariate(rate_rps)
        if now_s >= start_s + duration_s:
            return out
        segment = Segment(hash_str(f"cold:{tenant}:{index}", seed), prompt_tokens)
        out.append(
            WorkloadRequest(
                index, now_s, (segment,), output_tokens,
                tenant=tenant, priority=priority, deadline_ms=deadline_ms,
            )
        )  # fmt: skip
        index += 1


def merged(*streams: Sequence[WorkloadRequest]) -> tuple[WorkloadRequest, ...]:
    """One request list in arrival order, request ids renumbered."""
    everything = sorted((r for s in streams for r in s), key=lambda r: r.arrival_s)
    return tuple(replace(r, request_id=i) for i, r in enumerate(everything))


@dataclass(frozen=True, slots=True)
class Run:
    requests: tuple[WorkloadRequest, ...]
    records: list[RequestRecord]
    conserved: bool


def simulate(
    requests: tuple[WorkloadRequest, ...],
    spec: EngineSpec,
    instances: int,
    strategy: StrategyConfig,
    *,
    seed: int,
    flow: FlowControlConfig | None = None,
) -> Run:
    """One run on ``instances`` engines of ``spec``; ``flow``: flow control in front."""
    prepared = prepare(requests, spec.block_tokens)
    keys = routing_keys(prepared, DEFAULT_PREFIX_LENGTH, sessions=True)
    routing = build_strategy(strategy, strategy_rng(seed, strategy.type))
    gate = None if flow is None else FlowGate(flow, routing.choose, TtftPredictor(spec))
    config = SimConfig(instances=instances, engine=spec)
    result = Simulator(config, routing, requests, keys, flow=gate).run()
    records = result.records
    served = sum(1 for r in records if r.done and not r.rejected)
    refused = sum(1 for r in records if r.rejected)
    conserved = all(r.done for r in records) and served + refused == len(records)
    return Run(requests, records, conserved)


Select = Callable[[WorkloadRequest], bool]


def served(run: Run, select: Select) -> list[RequestRecord]:
    return [
        rec
        for req, rec in zip(run.requests, run.records, strict=True)
        if select(req) and rec.first_token_s >= 0 and not rec.rejected
    ]


def p_ttft_ms(run: Run, select: Select, pct: float) -> float:
    ttfts = [r.first_token_s - r.arrival_s for r in served(run, select)]
    return round(percentile(ttfts, pct) * 1000.0, 1)


def hit_rate(run: Run, select: Select) -> float:
    done = served(run, select)
    prompt = sum(r.prompt_tokens for r in done)
    return round(sum(r.cached_tokens for r in done) / prompt, 4) if prompt else 0.0


def shed_count(run: Run, select: Select) -> int:
    return sum(
        1
        for req, rec in zip(run.requests, run.records, strict=True)
        if select(req) and rec.shed_status
    )


def slo_attainment(run: Run, select: Select, slo_s: float) -> float:
    """Of the selected requests, the fraction served with a TTFT within ``slo_s`` (a shed
    request misses its objective)."""
    chosen = [rec for req, rec in zip(run.requests, run.records, strict=True) if select(req)]
    met = sum(
        1
        for r in chosen
        if not r.rejected and r.first_token_s >= 0 and r.first_token_s - r.arrival_s <= slo_s
    )
    return round(met / len(chosen), 4) if chosen else 0.0
