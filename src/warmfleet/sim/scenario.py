"""Scenario documents (versioned YAML) and the built-in scenarios, turned into request lists."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from warmfleet.api.trace_format import MAX_INSTANCES, TraceFile
from warmfleet.core.config import StrictModel, load_yaml_text, parse_document, validate_fields
from warmfleet.core.errors import ConfigError
from warmfleet.engine.presets import get_preset
from warmfleet.engine.spec import EngineSpec
from warmfleet.sim.kv_feed import KvEventsSim
from warmfleet.sim.records import ScaleEvent
from warmfleet.sim.workloads.arrivals import (
    ArrivalConfig,
    PoissonArrival,
    TraceArrival,
    apply_arrivals,
    scale_to_rate,
)
from warmfleet.sim.workloads.base import WorkloadRequest
from warmfleet.sim.workloads.equivalents import (
    azure_equivalent,
    mooncake_equivalent,
    sharegpt_equivalent,
)
from warmfleet.sim.workloads.synthetic import (
    AwsLongContextConfig,
    GspConfig,
    MultiRoundQaConfig,
    aws_long_context,
    gsp,
    multi_round_qa,
)
from warmfleet.sim.workloads.traces import (
    DEFAULT_TRACES,
    MOONCAKE_BLOCK_TOKENS,
    AzureConfig,
    MooncakeConfig,
    ShareGptReplayConfig,
    Trace,
    azure,
    mooncake,
    parse_trace_text,
    sharegpt_replay,
    trace_file_requests,
)


class TraceFileConfig(StrictModel):
    """A trace in warmfleet's trace format (docs/trace-format.md), replayed as it is: its
    timestamps as arrivals, its header's block size (``warmfleet sim --trace FILE``)."""

    type: Literal["warmfleet-trace"] = "warmfleet-trace"
    trace: str | None = None


WorkloadConfig = Annotated[
    AwsLongContextConfig
    | ShareGptReplayConfig
    | GspConfig
    | MultiRoundQaConfig
    | MooncakeConfig
    | AzureConfig
    | TraceFileConfig,
    Field(discriminator="type"),
]


class ScaleEventConfig(StrictModel):
    at_s: float = Field(ge=0.0)
    action: Literal["add", "remove"]
    instance_id: str | None = None


class EngineOverrides(StrictModel):
    """Fields of the preset's EngineSpec to replace (all optional)."""

    block_tokens: int | None = Field(None, ge=1)
    kv_capacity_tokens: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    step_overhead_s: float | None = Field(None, ge=0.0)
    prefill_s_per_token: float | None = Field(None, ge=0.0)
    prefill_attn_s_per_token_pair: float | None = Field(None, ge=0.0)
    decode_s_per_seq: float | None = Field(None, ge=0.0)
    kv_read_s_per_token: float | None = Field(None, ge=0.0)


class ScenarioSpec(StrictModel):
    """``apiVersion: warmfleet.dev/v1alpha1``, ``kind: Scenario``."""

    api_version: Literal["warmfleet.dev/v1alpha1"] = "warmfleet.dev/v1alpha1"
    kind: Literal["Scenario"] = "Scenario"
    name: str
    workload: WorkloadConfig
    arrival: ArrivalConfig | None = None  # None: the workload's own (see DEFAULT_ARRIVALS)
    instances: int = Field(8, ge=1, le=MAX_INSTANCES)
    preset: str = "llama-3.1-70b-p5"
    engine: EngineOverrides = Field(default_factory=EngineOverrides)
    router_overhead_ms: float = Field(1.5, ge=0.0)
    scale_events: tuple[ScaleEventConfig, ...] = ()
    requests: int | None = Field(None, ge=1)  # keep the first N requests
    seed: int = 0
    # Keys carry each request's session id (``RoutingKey.session``), as a client sending
    # ``x-warmfleet-session`` does; off: the router sees prompts only.
    sessions: bool = False
    # The engines publish KV events (vLLM with ``--kv-events-config``) that reach each gateway
    # replica this long after an engine's cache changed (``sim.kv_feed``); None: no events.
    kv_events_delay_ms: float | None = Field(None, ge=0.0, allow_inf_nan=False)


BUILTIN_WORKLOADS: dict[str, Any] = {
    "aws-long-context": AwsLongContextConfig,
    "aws-short-context": ShareGptReplayConfig,
    "gsp": GspConfig,
    "multi-round-qa": MultiRoundQaConfig,
    "mooncake": MooncakeConfig,
    "azure": AzureConfig,
}

# Open-loop defaults for the generated workloads (trace workloads keep their timestamps).
DEFAULT_RATES_RPS = {"aws-long-context": 20.0, "aws-short-context": 4.0, "gsp": 8.0}


def builtin_scenario(name: str, instances: int, preset: str, seed: int) -> ScenarioSpec:
    if name not in BUILTIN_WORKLOADS:
        raise ConfigError(
            f"scenario: unknown scenario {name!r}; choose one of {sorted(BUILTIN_WORKLOADS)} "
            "or give a YAML file"
        )
    return ScenarioSpec(
        name=name,
        workload=BUILTIN_WORKLOADS[name](),
        instances=instances,
        preset=preset,
        seed=seed,
    )


def parse_scenario(text: str, source: str = "scenario") -> ScenarioSpec:
    """A Scenario document's text (the caller read the file), validated."""
    return parse_document(ScenarioSpec, load_yaml_text(text, source), source)


def engine_spec(scenario: ScenarioSpec) -> EngineSpec:
    base = get_preset(scenario.preset)
    updates = scenario.engine.model_dump(exclude_none=True)
    spec = base.model_copy(update=updates)
    return validate_fields(EngineSpec, spec.model_dump(), "engine")


def default_arrival(scenario: ScenarioSpec) -> ArrivalConfig:
    rate = DEFAULT_RATES_RPS.get(scenario.workload.type)
    return TraceArrival() if rate is None else PoissonArrival(rate_rps=rate)


@dataclass(frozen=True, slots=True)
class BuiltWorkload:
    requests: tuple[WorkloadRequest, ...]
    block_tokens: int  # the engine's block size for this scenario
    closed_loop_concurrency: int | None
    source: str = "generated"  # what ran: "generated", "trace PATH" or a synthetic equivalent


def workload_source(scenario: ScenarioSpec, trace: Trace | None) -> str:
    """Says what the workload replays: a trace file, or (none read) its synthetic equivalent."""
    if not replays_trace(scenario):
        return "generated"
    if trace is not None:
        return f"trace {trace.source}"
    name = DEFAULT_TRACES[scenario.workload.type]
    return (
        f"synthetic equivalent of {name} (trace file not found; --trace or --traces-dir "
        "replays the real one)"
    )


def replays_trace(scenario: ScenarioSpec) -> bool:
    """Whether the scenario's workload replays a trace file (the caller reads it)."""
    return isinstance(
        scenario.workload, MooncakeConfig | AzureConfig | ShareGptReplayConfig | TraceFileConfig
    )


def trace_path(scenario: ScenarioSpec, trace: Path | None, traces_dir: Path | None) -> Path:
    """The file a trace-driven scenario replays, for the edge to read: ``trace`` (``--trace``),
    else the scenario's ``workload.trace``, else its default file in ``traces_dir``."""
    workload = scenario.workload
    configured = getattr(workload, "trace", None)
    if trace is not None:
        return trace
    if configured:
        return Path(configured)
    name = DEFAULT_TRACES.get(workload.type)
    if name is None:
        raise ConfigError(f"trace: no --trace given and no default trace for {workload.type!r}")
    if traces_dir is None:
        raise ConfigError(f"trace: no --trace given and no traces directory to find {name} in")
    return traces_dir / name


def _raw_requests(
    scenario: ScenarioSpec, spec: EngineSpec, trace: Trace | None, parsed: TraceFile | None
) -> tuple[tuple[WorkloadRequest, ...], int | None]:
    """The requests, and the block size their trace's hash ids are in (None: the engine's)."""
    workload = scenario.workload
    seed = scenario.seed
    if isinstance(workload, TraceFileConfig):
        if trace is None:
            raise ConfigError("trace: a warmfleet-trace workload needs --trace or workload.trace")
        parsed = parse_trace_text(trace) if parsed is None else parsed
        return trace_file_requests(parsed, seed), parsed.header.block_tokens
    if isinstance(workload, MooncakeConfig):  # the trace's hash ids are 512-token blocks
        if trace is None:
            return mooncake_equivalent(seed, workload.spread_buckets), MOONCAKE_BLOCK_TOKENS
        return mooncake(trace, seed, workload.spread_buckets), MOONCAKE_BLOCK_TOKENS
    return _generated_requests(scenario, spec, trace), None


def _generated_requests(
    scenario: ScenarioSpec, spec: EngineSpec, trace: Trace | None
) -> tuple[WorkloadRequest, ...]:
    workload = scenario.workload
    seed, limit = scenario.seed, scenario.requests  # only the requests kept are built
    if isinstance(workload, AwsLongContextConfig):
        return aws_long_context(workload, spec.kv_capacity_tokens, seed, limit)
    if isinstance(workload, GspConfig):
        return gsp(workload, seed, limit)
    if isinstance(workload, MultiRoundQaConfig):
        return multi_round_qa(workload, seed, limit)
    if isinstance(workload, AzureConfig):
        return azure(trace, seed) if trace is not None else azure_equivalent(seed)
    if not isinstance(workload, ShareGptReplayConfig):
        raise ConfigError(f"workload.type: {workload.type!r} is not a generated workload")
    if trace is None:
        return sharegpt_equivalent(workload, seed)
    return sharegpt_replay(trace, workload, seed)


def build_workload(
    scenario: ScenarioSpec,
    spec: EngineSpec,
    *,
    trace: Trace | None = None,
    rate_rps: float | None = None,
    parsed: TraceFile | None = None,
) -> BuiltWorkload:
    """The scenario's requests, timed by its arrival process; ``rate_rps`` overrides the rate.
    A trace-driven scenario replays ``trace`` (the edge read ``trace_path``'s file), or without
    one its synthetic equivalent (``workloads.equivalents``; ``source`` says so). ``parsed``:
    a warmfleet trace's records already parsed (``parse_trace_text``), not parsed again."""
    requests, trace_block_tokens = _raw_requests(scenario, spec, trace, parsed)
    if trace is not None and not requests:  # else every table is zeros and the exit status 0
        raise ConfigError(f"trace: {trace.source}: no requests (an empty trace)")
    arrival = scenario.arrival or default_arrival(scenario)
    rng = random.Random(scenario.seed + 1)
    if rate_rps is not None and isinstance(arrival, TraceArrival):
        requests = tuple(sorted(requests, key=lambda r: (r.arrival_s, r.request_id)))
        if scenario.requests is not None:
            requests = requests[: scenario.requests]
        requests = scale_to_rate(requests, rate_rps)
    elif rate_rps is not None and hasattr(arrival, "rate_rps"):
        arrival = arrival.model_copy(update={"rate_rps": rate_rps})
    if scenario.requests is not None:
        requests = requests[: scenario.requests]
    timed = apply_arrivals(requests, arrival, rng)
    block_tokens = spec.block_tokens
    if trace_block_tokens is not None and scenario.engine.block_tokens is None:
        block_tokens = trace_block_tokens
    concurrency = getattr(arrival, "concurrency", None)
    return BuiltWorkload(timed, block_tokens, concurrency, workload_source(scenario, trace))


def scale_events(scenario: ScenarioSpec) -> tuple[ScaleEvent, ...]:
    return tuple(ScaleEvent(e.at_s, e.action, e.instance_id) for e in scenario.scale_events)


def kv_events_of(scenario: ScenarioSpec) -> KvEventsSim | None:
    """The engines' KV events in ``scenario`` (None: they publish none)."""
    delay_ms = scenario.kv_events_delay_ms
    return None if delay_ms is None else KvEventsSim(delay_ms / 1000.0)
