"""`warmfleet sim` (simulator comparison) and `warmfleet demo-sim` (its quick four-strategy run)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from warmfleet.bench.progress import PhasedProgress, activity_for
from warmfleet.bench.replicas_report import replicas_tables
from warmfleet.bench.report import comparison_table, write_json, write_plots
from warmfleet.core.config import parse_document
from warmfleet.core.errors import ConfigError, WarmfleetError
from warmfleet.core.failures import one_line
from warmfleet.display import (
    FormatOpt,
    OutputFormat,
    WideOpt,
    chatter_console,
    emit,
    output_console,
)
from warmfleet.edge import TRACES_DIR_ENV, load_yaml_file, read_text_file, resolve_traces_dir
from warmfleet.routing.config import STRATEGY_NAMES, StrategyConfig
from warmfleet.routing.factory import strategy_config as strategy_config_of
from warmfleet.routing.flow_config import FlowControlConfig
from warmfleet.sim.replica_sweep import ReplicaSweep, run_replica_sweep
from warmfleet.sim.runner import Comparison, run_comparison
from warmfleet.sim.scenario import (
    BUILTIN_WORKLOADS,
    BuiltWorkload,
    ScenarioSpec,
    builtin_scenario,
    parse_scenario,
    replays_trace,
    trace_path,
)
from warmfleet.sim.trace_fleet import trace_header, trace_scenario
from warmfleet.sim.workloads.arrivals import PoissonArrival
from warmfleet.sim.workloads.synthetic import AwsLongContextConfig
from warmfleet.sim.workloads.traces import Trace

DEFAULT_STRATEGIES = "random,least_outstanding_requests,prefix_hash,prefix_affinity"
DEMO_STRATEGIES = ("random", "least_outstanding_requests", "prefix_hash", "prefix_affinity")


def _scenario(  # noqa: PLR0917 (one parameter per CLI option)
    name: str,
    instances: int | None,
    preset: str | None,
    seed: int | None,
    requests: int | None,
    sessions: bool = False,
) -> ScenarioSpec:
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
    the default file is absent: the scenario then runs its synthetic equivalent (a file named
    by ``--trace`` or ``workload.trace`` must exist)."""
    if not replays_trace(scenario):
        return None
    path = trace_path(scenario, trace, resolve_traces_dir(traces_dir))
    named = trace is not None or getattr(scenario.workload, "trace", None)
    if not named and not path.is_file():
        return None
    try:
        return Trace(read_text_file(path), str(path))
    except ConfigError as err:
        raise ConfigError(f"trace: {err}") from err


def _spec_and_trace(
    scenario: str | None,
    trace: Path | None,
    traces_dir: Path | None,
    overrides: tuple[int | None, str | None, int | None, int | None],
    sessions: bool = False,
) -> tuple[ScenarioSpec, Trace | None]:
    """``--scenario`` (its trace found as ``read_trace`` says), or ``--trace FILE`` alone: a
    trace in warmfleet's format on the fleet of its header, the flags winning
    (``sim.trace_fleet``)."""
    instances, preset, seed, requests = overrides
    if scenario is not None:
        spec = _scenario(scenario, instances, preset, seed, requests, sessions)
        return spec, read_trace(spec, trace, traces_dir)
    if trace is None:
        raise typer.BadParameter("give --scenario, or --trace FILE (warmfleet's trace format)")
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


def _strategies(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [n for n in names if n not in STRATEGY_NAMES]
    if unknown or not names:
        raise typer.BadParameter(f"unknown strategies {unknown}; choose from {STRATEGY_NAMES}")
    return names


def _strategy_configs(paths: list[Path], names: list[str]) -> dict[str, StrategyConfig]:
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


def _workload_line(fmt: OutputFormat) -> Callable[[BuiltWorkload], None]:
    """Says first which trace (or its equivalent) drives the run, when it is not generated."""

    def say(workload: BuiltWorkload) -> None:
        if workload.source != "generated":
            line = f"workload: {workload.source}"
            chatter_console(fmt).print(line, markup=False, highlight=False, soft_wrap=True)

    return say


def _emit(
    comparison: Comparison,
    json_out: Path | None,
    report_dir: Path | None,
    fmt: OutputFormat = OutputFormat.table,
    wide: bool = False,
) -> None:
    """The table (or TSV/JSON on stdout, the other lines then on stderr), then the files."""
    report = comparison.report()
    console = chatter_console(fmt)
    table = comparison_table(comparison, {r.name: r.wall_s for r in comparison.runs})
    emit(table, fmt, wide=wide, document=report)
    for run in comparison.runs:
        if not (run.conserved and run.time_monotonic):
            console.print(f"[red]{run.name}: conservation or time-order check failed[/red]")
        m = run.metrics
        if m.rejected - m.shed:  # the engine could not hold them: left out of every figure
            console.print(
                f"[yellow]{run.name}: {m.rejected - m.shed} of {m.submitted} requests rejected "
                f"(prompt + output over max_model_len {comparison.engine.max_model_len} or the "
                f"KV capacity); the figures cover the {m.completed} completed[/yellow]"
            )
    if json_out is not None:
        write_json(report, json_out)
        console.print(f"wrote {json_out}")
    if report_dir is not None:
        write_json(report, report_dir / "report.json")
        for path in write_plots(comparison, report_dir):
            console.print(f"wrote {path}")


def _replica_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as err:
        raise typer.BadParameter(f"--gateway-replicas: not integers: {text!r}") from err
    if not counts or min(counts) < 1:
        raise typer.BadParameter(f"--gateway-replicas: integers >= 1, got {text!r}")
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


def _emit_sweep(sweep: ReplicaSweep, json_out: Path | None, fmt: OutputFormat) -> None:
    """The replicas tables, or (``--format json``) the sweep's report on stdout."""
    console = chatter_console(fmt)
    if fmt == OutputFormat.table:
        for table in replicas_tables(sweep):
            console.print(table)
    else:
        output_console().file.write(json.dumps(sweep.report(), indent=1, default=str) + "\n")
    for cell in sweep.cells:
        if not (cell.run.conserved and cell.run.time_monotonic):
            console.print(
                f"[red]{cell.strategy} x {cell.replicas}: conservation or time-order failed[/red]"
            )
    if json_out is not None:
        write_json(sweep.report(), json_out)
        console.print(f"wrote {json_out}")


_SCENARIO_HELP = (
    f"a built-in scenario ({', '.join(BUILTIN_WORKLOADS)}) or a Scenario YAML file;"
    " trace-driven ones read their trace from --traces-dir, or without it run a synthetic"
    " equivalent; without --scenario, --trace FILE is replayed as warmfleet's trace format"
)


def sim(  # noqa: PLR0917 (one parameter per CLI option)
    scenario: Annotated[str | None, typer.Option(help=_SCENARIO_HELP)] = None,
    strategies: Annotated[str, typer.Option(help="comma-separated strategy names")] = (
        DEFAULT_STRATEGIES
    ),
    trace: Annotated[
        Path | None,
        typer.Option(help="trace file: of a trace-driven scenario, or alone a warmfleet trace"),
    ] = None,
    traces_dir: Annotated[
        Path | None,
        typer.Option(
            help=f"directory of the default trace files (else ${TRACES_DIR_ENV}, "
            "else ../shared/traces from the current directory)"
        ),
    ] = None,
    instances: Annotated[int | None, typer.Option(min=1)] = None,
    preset: Annotated[str | None, typer.Option(help="engine preset")] = None,
    seed: Annotated[int | None, typer.Option()] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the JSON report")] = None,
    report: Annotated[Path | None, typer.Option(help="directory for report.json and PNGs")] = None,
    requests: Annotated[int | None, typer.Option(min=1, help="keep the first N requests")] = None,
    rate: Annotated[float | None, typer.Option(min=1e-6, help="offered load, requests/s")] = None,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="closed loop with N clients (saturation mode)")
    ] = None,
    gateway_replicas: Annotated[
        str, typer.Option(help="gateway replicas, or a comma-separated list to sweep")
    ] = "1",
    sync_delay_ms: Annotated[
        str,
        typer.Option(help="replica sync delay in ms ('none': no sync), or a list to sweep"),
    ] = "0",
    sessions: Annotated[
        bool,
        typer.Option(
            "--sessions", help="keys carry each request's session id (as x-warmfleet-session)"
        ),
    ] = False,
    flow: Annotated[
        Path | None,
        typer.Option(help="flow-control YAML (routing.flow, docs/flow-control.md) in front"),
    ] = None,
    kv_events_delay_ms: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="the engines publish KV events, reaching the gateway this many ms later "
            "(as vLLM with --kv-events-config; default: the scenario's, else none)",
        ),
    ] = None,
    strategy_config: Annotated[
        list[Path] | None,
        typer.Option(
            help="a strategy's settings (routing.strategy YAML, with its type) in place of its "
            "defaults; repeatable"
        ),
    ] = None,
    fmt: FormatOpt = OutputFormat.table,
    wide: WideOpt = False,
) -> None:
    """Compare routing strategies on a simulated fleet (virtual time); with
    --gateway-replicas/--sync-delay-ms, the hit rate per (replicas, delay) instead."""
    if concurrency is not None and rate is not None:
        raise typer.BadParameter("give at most one of --concurrency and --rate")
    if flow is not None and gateway_replicas != "1":
        raise typer.BadParameter("--flow runs with one gateway replica")
    counts, delays = _replica_counts(gateway_replicas), sync_delays(sync_delay_ms)
    sweep = counts != [1] or delays != [0.0]
    if sweep and fmt == OutputFormat.tsv:
        raise typer.BadParameter("--format tsv is for one gateway; use json with replicas")
    if sweep and report is not None:
        raise typer.BadParameter("--report (plots) is for one gateway; use --json with replicas")
    try:
        names = _strategies(strategies)
        configs = _strategy_configs(strategy_config or [], names)
        flow_config = None
        if flow is not None:
            doc = load_yaml_file(flow)
            flow_config = parse_document(FlowControlConfig, doc, str(flow))
        spec, trace_data = _spec_and_trace(
            scenario, trace, traces_dir, (instances, preset, seed, requests), sessions
        )
        spec = with_kv_events(spec, kv_events_delay_ms)
        with activity_for(fmt) as activity:
            progress = PhasedProgress(activity)
            if sweep:
                swept = run_replica_sweep(
                    spec, names, counts, delays,
                    trace=trace_data, rate_rps=rate, concurrency=concurrency,
                    progress=progress, on_workload=_workload_line(fmt), configs=configs,
                )  # fmt: skip
            else:
                comparison = run_comparison(
                    spec, names, trace=trace_data, rate_rps=rate, concurrency=concurrency,
                    progress=progress, on_workload=_workload_line(fmt), flow=flow_config,
                    configs=configs,
                )  # fmt: skip
            progress.close()
        if sweep:
            _emit_sweep(swept, json_out, fmt)
            return
    except WarmfleetError as err:
        typer.echo(f"error: {one_line(str(err))}", err=True)  # one line, never wrapped
        raise typer.Exit(2) from err
    _emit(comparison, json_out, report, fmt, wide)


def demo_scenario() -> ScenarioSpec:
    """A scaled-down aws-long-context (8B engines so the working set stays small) for < 60 s."""
    return ScenarioSpec(
        name="aws-long-context-demo",
        workload=AwsLongContextConfig(working_set_ratio=3.0, requests=1200),
        arrival=PoissonArrival(rate_rps=9.0),
        instances=7,
        preset="llama-3.1-8b-h100",
        seed=0,
    )


def demo(
    report: Annotated[Path, typer.Option(help="output directory")] = Path("warmfleet-report"),
    fmt: FormatOpt = OutputFormat.table,
    wide: WideOpt = False,
) -> None:
    """Simulator-only demo: the four strategies on a scaled-down aws-long-context (virtual time)."""
    started = time.perf_counter()
    with activity_for(fmt) as activity:
        progress = PhasedProgress(activity)
        comparison = run_comparison(demo_scenario(), DEMO_STRATEGIES, progress=progress)
        progress.close()
    _emit(comparison, None, report, fmt, wide)
    chatter_console(fmt).print(f"demo finished in {time.perf_counter() - started:.1f} s")


def register(app: typer.Typer) -> None:
    app.command("sim")(sim)
    app.command("demo-sim")(demo)
