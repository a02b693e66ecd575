"""The fleet a warmfleet trace replays on (``warmfleet sim --trace FILE``, ``warmfleet doctor``).

The trace's header says what it was captured on (``fleet.instances``, ``preset``,
``kv_capacity_tokens``, ``strategy``); the command line's ``--instances`` / ``--preset`` win over
it (an explicit flag is what the user asked for); without either, ``warmfleet doctor`` counts the
instances a capture's records show from its start, else 8 x llama-3.1-70b-p5 as in
``warmfleet sim``. The header's ``kv_capacity_tokens`` replaces the preset's unless ``--preset``
was given (then the preset's own capacity holds).
"""

from __future__ import annotations

from typing import Any

from warmfleet.api.trace_format import TraceHeader, parse_trace
from warmfleet.core.errors import ConfigError
from warmfleet.routing.config import StrategyConfig
from warmfleet.routing.factory import strategy_config
from warmfleet.sim.scenario import EngineOverrides, ScenarioSpec, TraceFileConfig
from warmfleet.sim.workloads.traces import Trace

DEFAULT_INSTANCES = 8
DEFAULT_PRESET = "llama-3.1-70b-p5"


def trace_header(trace: Trace) -> TraceHeader:
    """The header of ``trace`` (the default one when its first line is a record); only the
    first line is read here, the records are parsed when the workload is built."""
    for line in trace.text.splitlines():
        if line.strip():
            parsed = parse_trace([line], f"trace: {trace.source}")
            return parsed.header
    return TraceHeader()


def trace_scenario(
    trace: Trace,
    header: TraceHeader,
    *,
    instances: int | None = None,
    preset: str | None = None,
    seed: int | None = None,
    requests: int | None = None,
    seen_instances: int | None = None,
) -> ScenarioSpec:
    """The scenario replaying ``trace`` on its fleet (flags win over the header);
    ``seen_instances`` (the instances a capture shows from its start) comes after both."""
    fleet = header.fleet
    kv_tokens = fleet.kv_capacity_tokens if preset is None else None
    return ScenarioSpec(
        name=f"trace {trace.source.rsplit('/', 1)[-1]}",
        workload=TraceFileConfig(trace=trace.source),
        instances=instances or fleet.instances or seen_instances or DEFAULT_INSTANCES,
        preset=preset or fleet.preset or DEFAULT_PRESET,
        engine=EngineOverrides(kv_capacity_tokens=kv_tokens),
        seed=seed or 0,
        requests=requests,
    )


def captured_strategy(header: TraceHeader) -> tuple[str, StrategyConfig] | None:
    """The strategy the trace was captured under (its ``type`` and parameters), or None."""
    document: dict[str, Any] | None = header.fleet.strategy
    if document is None:
        return None
    params = dict(document)
    name = params.pop("type", None)
    if not isinstance(name, str):
        raise ConfigError("trace header: fleet.strategy.type: a strategy name is required")
    return name, strategy_config(name, **params)
