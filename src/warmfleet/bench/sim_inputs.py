"""What `warmfleet sim` (and `bench`, `doctor`) read before a run: the scenario, its trace file,
the strategies and their settings, the gateway replicas and sync delays.

Every check here runs before any work, and a bad input is one line (a ``ConfigError``, or a
``typer.BadParameter`` for a malformed flag value).
"""

from __future__ import annotations

import math
from pathlib import Path

import typer

from warmfleet.api.trace_format import MAX_INSTANCES
from warmfleet.core.errors import ConfigError
from warmfleet.edge import (
    check_output_dir,
    check_output_file,
    load_yaml_file,
    read_text_file,
    resolve_traces_dir,
)
from warmfleet.routing.config import STRATEGY_NAMES, StrategyConfig
from warmfleet.routing.factory import strategy_config as strategy_config_of
from warmfleet.sim.scenario import (
    ScenarioSpec,
    builtin_scenario,
    parse_scenario,
    replays_trace,
    trace_path,
)
from warmfleet.sim.trace_fleet import trace_header, trace_scenario
from warmfleet.sim.workloads.traces import Trace


def check_outputs(json_out: Path | None, report: Path | None) -> None:
    """``--json`` and ``--report`` can be written: checked before the run, not after it."""
    if json_out is not None:
        check_output_file(json_out, "--json")
    if report is not None:
        check_output_dir(report, "--report")


def scenario_spec(  # noqa: PLR0917 (one parameter per CLI option)
    name: str,
    instances: int | None,
    preset: str | None,
    seed: int | None,
    requests: int | None,
    sessions: bool = False,
) -> ScenarioSpec:
    """A built-in scenario or a Scenario YAML file, with the flags given applied."""
    if name.endswith((".yaml", ".yml")) or Path(name).is_file():
        spec = parse_scenario(read_text_file(Path(name)), name)
    else:
        spec = builtin_scenario(name, 8, "llama-3.1-70b-p5", 0)
    updates: dict[str, object] = {}
    if instances is not None:
        updates["instances"] = instances
    if preset is not None:
        updates["preset"] = preset
    if seed is not None:
        updates["seed"] = seed
    if requests is not None:
        updates["requests"] = requests
    if sessions:
        updates["sessions"] = True
    return spec.model_copy(update=updates)


def read_trace(
    scenario: ScenarioSpec, trace: Path | None = None, traces_dir: Path | None = None
) -> Trace | None:
    """The trace file a trace-driven scenario replays, found and read here at the edge:
    ``trace``, else the scenario's ``workload.trace``, else its default file in the traces
    directory (``warmfleet.edge.resolve_traces_dir``). None for a generated workload, and when
    the default file is absent from the default traces directory (``$WARMFLEET_TRACES_DIR``,
    else ../shared/traces): the scenario then runs its synthetic equivalent. A file named by
    ``--trace`` or ``workload.trace``, or the default file of a ``--traces-dir`` given, must
    exist (a ConfigError otherwise)."""
    if not replays_trace(scenario):
        return None
    path = trace_path(scenario, trace, resolve_traces_dir(traces_dir))
    named = trace is not None or traces_dir is not None or getattr(scenario.workload, "trace", None)
    if not named and not path.is_file():
        return None
    try:
        return Trace(read_text_file(path), str(path))
    except ConfigError as err:
        raise ConfigError(f"trace: {err}") from err


def spec_and_trace(
    scenario: str | None,
    trace: Path | None,
    traces_dir: Path | None,
    overrides: tuple[int | None, str | None, int | None, int | None],
    sessions: bool = False,
) -> tuple[ScenarioSpec, Trace | None]:
    """``--scenario`` (its trace found as ``read_trace`` says), or ``--trace FILE`` alone: a
    trace in warmfleet's format on the fleet of its header, the flags winning
    (``sim.trace_fleet``). ``--trace``/``--traces-dir`` with a generated scenario, or
    ``--traces-dir`` without a scenario, is a ConfigError (they would be ignored)."""
    instances, preset, seed, requests = overrides
    if scenario is not None:
        spec = scenario_spec(scenario, instances, preset, seed, requests, sessions)
        if not replays_trace(spec) and (trace is not None or traces_dir is not None):
            flag = "--trace" if trace is not None else "--traces-dir"
            kind = spec.workload.type
            name = spec.name if spec.name == kind else f"{spec.name} ({kind})"
            raise ConfigError(
                f"{flag}: scenario {name} generates its requests, it replays no trace"
            )
        return spec, read_trace(spec, trace, traces_dir)
    if trace is None:
        raise typer.BadParameter("give --scenario, or --trace FILE (warmfleet's trace format)")
    if traces_dir is not None:
        raise ConfigError("--traces-dir: for the default trace of a trace-driven --scenario")
    data = Trace(read_text_file(trace), str(trace))
    spec = trace_scenario(
        data, trace_header(data), instances=instances, preset=preset, seed=seed,
        requests=requests,
    )  # fmt: skip
    return (spec.model_copy(update={"sessions": True}) if sessions else spec), data


def with_kv_events(spec: ScenarioSpec, delay_ms: float | None) -> ScenarioSpec:
    """``--kv-events-delay-ms`` applied to ``spec`` (None: the scenario's own)."""
    if delay_ms is None:
        return spec
    if not math.isfinite(delay_ms):
        raise typer.BadParameter(f"--kv-events-delay-ms: a finite number, got {delay_ms}")
    return spec.model_copy(update={"kv_events_delay_ms": delay_ms})


def parse_strategies(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [n for n in names if n not in STRATEGY_NAMES]
    if unknown or not names:
        raise typer.BadParameter(f"unknown strategies {unknown}; choose from {STRATEGY_NAMES}")
    return names


def strategy_configs(paths: list[Path], names: list[str]) -> dict[str, StrategyConfig]:
    """``--strategy-config`` files by the strategy they configure (one of ``names``, once)."""
    configs: dict[str, StrategyConfig] = {}
    for path in paths:
        doc = load_yaml_file(path)
        name = doc.get("type") if isinstance(doc, dict) else None
        if not isinstance(name, str):
            raise ConfigError(f"{path}: a strategy's settings with its type (type: <strategy>)")
        if name not in names:
            raise ConfigError(f"{path}: type: not in --strategies: {name!r}")
        if name in configs:
            raise ConfigError(f"{path}: type: a second file for {name!r}")
        settings = {str(k): v for k, v in doc.items() if k != "type"}
        try:
            configs[name] = strategy_config_of(name, **settings)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from err
    return configs


def replica_counts(text: str) -> list[int]:
    """``--gateway-replicas``: one count or a comma-separated list, each 1 to MAX_INSTANCES."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as err:
        raise typer.BadParameter(f"--gateway-replicas: not integers: {text!r}") from err
    if not counts or min(counts) < 1 or max(counts) > MAX_INSTANCES:
        raise typer.BadParameter(
            f"--gateway-replicas: integers from 1 to {MAX_INSTANCES}, got {text!r}"
        )
    return counts


def sync_delays(text: str) -> list[float | None]:
    delays: list[float | None] = []
    for part in (p.strip() for p in text.split(",")):
        if part.lower() == "none":
            delays.append(None)
            continue
        try:
            delay = float(part)
        except ValueError as err:
            raise typer.BadParameter(f"--sync-delay-ms: not a number or 'none': {part!r}") from err
        if not 0.0 <= delay < float("inf"):
            raise typer.BadParameter(f"--sync-delay-ms: must be >= 0, got {part!r}")
        delays.append(delay)
    return delays
