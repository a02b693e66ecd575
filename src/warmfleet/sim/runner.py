"""Run one scenario under several strategies and assemble the comparison report (pure data).

Only wall-clock timing of each run is measured here (``time.perf_counter``), and it is kept out
of the report so the same seed gives byte-identical JSON.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from warmfleet.core.errors import ConfigError
from warmfleet.core.hashing import hash_str
from warmfleet.core.progress import NoProgress, RunProgress
from warmfleet.core.types import InstanceId, RoutingKey
from warmfleet.engine.spec import EngineSpec
from warmfleet.flow.gate import FlowGate
from warmfleet.flow.model import TtftPredictor
from warmfleet.routing.base import Strategy
from warmfleet.routing.config import PrefixHashConfig, StrategyConfig
from warmfleet.routing.factory import build_strategy, strategy_config
from warmfleet.routing.flow_config import FlowControlConfig
from warmfleet.routing.key_spec import DEFAULT_PREFIX_LENGTH
from warmfleet.routing.keys import key_from_blocks
from warmfleet.routing.movement import moved_fraction
from warmfleet.sim.gateways import Gateways, GatewaySync
from warmfleet.sim.metrics import RunMetrics, compute_metrics
from warmfleet.sim.scenario import (
    BuiltWorkload,
    ScenarioSpec,
    build_workload,
    engine_spec,
    kv_events_of,
    scale_events,
)
from warmfleet.sim.simulator import SimConfig, Simulator
from warmfleet.sim.tenants import tenant_figures
from warmfleet.sim.workloads.base import PrefixBlockHasher, WorkloadRequest, default_seed
from warmfleet.sim.workloads.traces import Trace

MOVEMENT_SAMPLE_KEYS = 2000


@dataclass(frozen=True, slots=True)
class Prepared:
    """A workload turned into block hashes for one engine block size."""

    requests: tuple[WorkloadRequest, ...]
    block_hashes: tuple[tuple[int, ...], ...]
    block_tokens: int
    chain_seed: int


def prepare(
    requests: Sequence[WorkloadRequest],
    block_tokens: int,
    progress: RunProgress | None = None,
) -> Prepared:
    """Hash every request's blocks (``progress``: one unit per request)."""
    seeds: dict[str | None, PrefixBlockHasher] = {}
    hashes = []
    for req in requests:
        hasher = seeds.get(req.tenant)
        if hasher is None:
            hasher = PrefixBlockHasher(block_tokens, default_seed(tenant=req.tenant))
            seeds[req.tenant] = hasher
        hashes.append(hasher.blocks(req.segments))
        if progress is not None:
            progress.advance()
    return Prepared(tuple(requests), tuple(hashes), block_tokens, default_seed())


def routing_keys(
    prepared: Prepared, prefix_length: int, *, sessions: bool = False
) -> list[RoutingKey]:
    """The requests' keys; ``sessions``: each carries its request's ``session_id``."""
    return [
        key_from_blocks(
            hashes,
            block_size=prepared.block_tokens,
            units=req.prompt_tokens,
            prompt_tokens=req.prompt_tokens,
            prefix_length=prefix_length,
            seed=prepared.chain_seed,
            output_tokens_hint=req.output_tokens,
            session=None if not sessions or req.session_id is None else str(req.session_id),
        )
        for req, hashes in zip(prepared.requests, prepared.block_hashes, strict=True)
    ]


def prefix_length_of(config: StrategyConfig) -> int:
    return config.prefix_length if isinstance(config, PrefixHashConfig) else DEFAULT_PREFIX_LENGTH


def strategy_rng(seed: int, name: str) -> random.Random:
    return random.Random(hash_str(name, seed))


def replica_rng(seed: int, name: str, replica: int) -> random.Random:
    """Gateway replica ``replica``'s strategy randomness (replica 0: ``strategy_rng``'s)."""
    return strategy_rng(seed, name if replica == 0 else f"{name}@replica-{replica}")


@dataclass(slots=True)
class StrategyRun:
    name: str
    metrics: RunMetrics
    wall_s: float
    conserved: bool
    time_monotonic: bool


@dataclass(slots=True)
class Comparison:
    scenario: ScenarioSpec
    engine: EngineSpec
    workload: BuiltWorkload
    working_set_ratio: float
    runs: list[StrategyRun] = field(default_factory=list)
    configs: Mapping[str, StrategyConfig] = field(default_factory=dict)  # other than defaults

    def report(self) -> dict[str, object]:
        return {
            "scenario": self.scenario.name,
            "workload": self.workload.source,
            "preset": self.scenario.preset,
            "seed": self.scenario.seed,
            "instances": self.scenario.instances,
            "requests": len(self.workload.requests),
            "block_tokens": self.workload.block_tokens,
            "instance_kv_capacity_tokens": self.engine.kv_capacity_tokens,
            "working_set_ratio": self.working_set_ratio,
            "fleet_working_set_ratio": self.working_set_ratio / self.scenario.instances,
            "closed_loop_concurrency": self.workload.closed_loop_concurrency,
            "router_overhead_ms": self.scenario.router_overhead_ms,
            "kv_events_delay_ms": self.scenario.kv_events_delay_ms,  # None: no KV events
            "strategies": {run.name: run.metrics.as_report() for run in self.runs},
            "strategy_configs": configs_report(self.configs),
        }


def configs_report(configs: Mapping[str, StrategyConfig]) -> dict[str, str]:
    """The settings each strategy ran with other than its defaults, as configured: one line,
    ``sessionPlacement=hash, epsilon=0.5`` (a line keeps small floats the report would round)."""
    return {
        name: ", ".join(
            f"{field}={value if isinstance(value, str) else repr(value)}"
            for field, value in config.model_dump(by_alias=True, exclude_unset=True).items()
            if field != "type"
        )
        for name, config in sorted(configs.items())
    }


def _moved(
    config: StrategyConfig,
    seed: int,
    keys: Sequence[RoutingKey],
    result_scale: Sequence[tuple[tuple[str, ...], tuple[str, ...]]],
) -> list[float]:
    distinct: dict[int, RoutingKey] = {}
    for key in keys:
        distinct.setdefault(key.prefix_hash, key)
        if len(distinct) >= MOVEMENT_SAMPLE_KEYS:
            break
    sample = list(distinct.values())

    def factory() -> Strategy:
        return build_strategy(config, strategy_rng(seed, config.type))

    return [moved_fraction(factory, sample, before, after) for before, after in result_scale]


def run_strategy(
    name: str,
    scenario: ScenarioSpec,
    spec: EngineSpec,
    workload: BuiltWorkload,
    prepared: Prepared,
    *,
    check_invariants: bool = False,
    gateways: GatewaySync | None = None,
    progress: RunProgress | None = None,
    config: StrategyConfig | None = None,
    label: str | None = None,
    flow: FlowControlConfig | None = None,
    placements: Mapping[int, InstanceId] | None = None,
) -> StrategyRun:
    """One strategy's run; ``gateways``: several gateway replicas in sync (default: one);
    ``config``: other parameters than the strategy's defaults; ``label`` names the run (default:
    ``name``); ``flow``: flow control before the strategy (one gateway only); ``placements``:
    replayed instances by request index in ``prepared.requests`` (``sim.placements``; one
    without is the strategy's); ``progress``: a phase, one unit a finished request."""
    progress, label = progress or NoProgress(), label or name
    progress.phase(label, len(prepared.requests))
    config = config or strategy_config(name)
    keys = routing_keys(prepared, prefix_length_of(config), sessions=scenario.sessions)
    sim_config = SimConfig(
        instances=scenario.instances, engine=spec,
        router_overhead_s=scenario.router_overhead_ms / 1000.0,
        concurrency=workload.closed_loop_concurrency, scale_events=scale_events(scenario),
        check_invariants=check_invariants, kv_events=kv_events_of(scenario),
    )  # fmt: skip
    started = time.perf_counter()
    routing = _routing(name, config, scenario.seed, gateways)
    gate = None if flow is None else _flow_gate(flow, routing, spec)
    simulator = Simulator(
        sim_config, routing, prepared.requests, keys, on_finished=progress.advance, flow=gate,
        placements=placements,
    )  # fmt: skip
    result = simulator.run()
    wall_s = time.perf_counter() - started
    fleet_blocks = spec.capacity_blocks * scenario.instances
    metrics = compute_metrics(result, keys, spec.block_tokens, fleet_blocks)
    scale = [(r.before_ids, r.after_ids) for r in result.scale_records]
    metrics.moved_fraction = _moved(config, scenario.seed, keys, scale)
    records = result.records
    metrics.tenants = tenant_figures(prepared.requests, records)
    ended = metrics.completed + metrics.rejected == len(records)
    return StrategyRun(label, metrics, wall_s, ended and all(r.done for r in records),
                       result.time_trace_ok)  # fmt: skip


def _flow_gate(flow: FlowControlConfig, routing: Strategy | Gateways, spec: EngineSpec) -> FlowGate:
    """Flow control before ``routing`` (one gateway replica only)."""
    if isinstance(routing, Gateways):
        raise ConfigError("flow control: the simulator runs it with one gateway replica")
    return FlowGate(flow, routing.choose, TtftPredictor(spec))


def _routing(
    name: str, config: StrategyConfig, seed: int, gateways: GatewaySync | None
) -> Strategy | Gateways:
    """The run's strategy, or its gateway replicas (one strategy each, its own seeded random)."""
    if gateways is None:
        return build_strategy(config, strategy_rng(seed, name))
    return gateways.build(
        lambda r: build_strategy(config, replica_rng(seed, name, r)),
        random.Random(hash_str("gateway-replicas", seed)),
    )


def run_comparison(
    scenario: ScenarioSpec,
    strategies: Sequence[str],
    *,
    trace: Trace | None = None,
    rate_rps: float | None = None,
    concurrency: int | None = None,
    check_invariants: bool = False,
    progress: RunProgress | None = None,
    on_workload: Callable[[BuiltWorkload], None] | None = None,
    flow: FlowControlConfig | None = None,
    configs: Mapping[str, StrategyConfig] | None = None,
) -> Comparison:
    """Every strategy on the same workload. ``progress`` (a display, from the shell) gets a
    phase hashing the workload's blocks, then one per strategy, one unit per request;
    ``on_workload`` is called with the workload as soon as it is built; ``flow``: flow control
    in front of every strategy; ``configs``: by name, the strategies' settings other than their
    defaults."""
    comparison, prepared = prepare_comparison(
        scenario, trace=trace, rate_rps=rate_rps, concurrency=concurrency, progress=progress,
        on_workload=on_workload,
    )  # fmt: skip
    comparison.configs = dict(configs or {})
    for name in strategies:
        comparison.runs.append(
            run_strategy(
                name,
                comparison.scenario,
                comparison.engine,
                comparison.workload,
                prepared,
                check_invariants=check_invariants,
                progress=progress,
                flow=flow,
                config=comparison.configs.get(name),
            )
        )
    return comparison


def prepare_comparison(
    scenario: ScenarioSpec,
    *,
    trace: Trace | None = None,
    rate_rps: float | None = None,
    concurrency: int | None = None,
    progress: RunProgress | None = None,
    on_workload: Callable[[BuiltWorkload], None] | None = None,
) -> tuple[Comparison, Prepared]:
    """The scenario's workload, hashed, and an empty comparison (no run yet) to add runs to."""
    spec = engine_spec(scenario)
    if concurrency is not None:
        data = scenario.model_dump(by_alias=True)
        data["arrival"] = {"type": "closed", "concurrency": concurrency}
        scenario = ScenarioSpec.model_validate(data)
    workload = build_workload(scenario, spec, trace=trace, rate_rps=rate_rps)
    if on_workload is not None:
        on_workload(workload)
    spec = spec.with_block_tokens(workload.block_tokens)
    if progress is not None:
        progress.phase("hashing the workload's blocks", len(workload.requests))
    prepared = prepare(workload.requests, workload.block_tokens, progress)
    distinct = working_set_blocks_of(prepared)
    ratio = distinct / max(spec.capacity_blocks, 1)
    return Comparison(scenario, spec, workload, ratio), prepared


def working_set_blocks_of(prepared: Prepared) -> int:
    """Distinct full blocks over the whole workload."""
    distinct: set[int] = set()
    for hashes in prepared.block_hashes:
        distinct.update(hashes)
    return len(distinct)
