"""`warmfleet sim` (simulator comparison) and `warmfleet demo-sim` (its quick four-strategy run)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from warmfleet.api.trace_format import MAX_INSTANCES
from warmfleet.bench.progress import PhasedProgress, activity_for
from warmfleet.bench.replicas_report import replicas_tables
from warmfleet.bench.report import comparison_table, write_json, write_plots
from warmfleet.bench.sim_inputs import (
    check_outputs,
    parse_strategies,
    replica_counts,
    spec_and_trace,
    strategy_configs,
    sync_delays,
    with_kv_events,
)
from warmfleet.core.config import parse_document
from warmfleet.core.errors import WarmfleetError
from warmfleet.core.failures import one_line
from warmfleet.display import (
    FormatOpt,
    OutputFormat,
    WideOpt,
    chatter_console,
    emit,
    output_console,
)
from warmfleet.edge import TRACES_DIR_ENV, check_output_dir, load_yaml_file
from warmfleet.routing.config import StrategyConfig
from warmfleet.routing.flow_config import FlowControlConfig
from warmfleet.sim.replica_sweep import ReplicaSweep, run_replica_sweep
from warmfleet.sim.runner import Comparison, run_comparison
from warmfleet.sim.scenario import BUILTIN_WORKLOADS, BuiltWorkload, ScenarioSpec
from warmfleet.sim.workloads.arrivals import PoissonArrival
from warmfleet.sim.workloads.synthetic import AwsLongContextConfig
from warmfleet.sim.workloads.traces import Trace

DEFAULT_STRATEGIES = "random,least_outstanding_requests,prefix_hash,prefix_affinity"
DEMO_STRATEGIES = ("random", "least_outstanding_requests", "prefix_hash", "prefix_affinity")


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
    " trace-driven ones read their trace from --traces-dir (it must hold it), else the default"
    " traces directory, else run a synthetic equivalent; without --scenario, --trace FILE is"
    " replayed as warmfleet's trace format"
)
# The options of `sim` that take more than a line, so its signature reads as the option list.
# Every Path option says readable=False: the command reads (and writes) them itself, so a
# refused read is its one line, not click's box (click checks before the command's handler).
_TraceOpt = Annotated[
    Path | None,
    typer.Option(
        help="trace file: of a trace-driven scenario, or alone a warmfleet trace", readable=False
    ),
]
_TracesDirOpt = Annotated[
    Path | None,
    typer.Option(
        help=f"directory of the default trace files (else ${TRACES_DIR_ENV}, "
        "else ../shared/traces from the current directory)",
        readable=False,
    ),
]
_JsonOpt = Annotated[
    Path | None, typer.Option("--json", help="write the JSON report", readable=False)
]
_ReportOpt = Annotated[
    Path | None, typer.Option(help="directory for report.json and PNGs", readable=False)
]
_ConcurrencyOpt = Annotated[
    int | None, typer.Option(min=1, help="closed loop with N clients (saturation mode)")
]
_GatewayReplicasOpt = Annotated[
    str, typer.Option(help="gateway replicas, or a comma-separated list to sweep")
]
_SyncDelayOpt = Annotated[
    str, typer.Option(help="replica sync delay in ms ('none': no sync), or a list to sweep")
]
_SessionsOpt = Annotated[
    bool,
    typer.Option(
        "--sessions", help="keys carry each request's session id (as x-warmfleet-session)"
    ),
]
_FlowOpt = Annotated[
    Path | None,
    typer.Option(
        help="flow-control YAML (routing.flow, docs/flow-control.md) in front", readable=False
    ),
]
_KvEventsDelayOpt = Annotated[
    float | None,
    typer.Option(
        min=0.0,
        help="the engines publish KV events, reaching the gateway this many ms later "
        "(as vLLM with --kv-events-config; default: the scenario's, else none)",
    ),
]
_StrategyConfigOpt = Annotated[
    list[Path] | None,
    typer.Option(
        help="a strategy's settings (routing.strategy YAML, with its type) in place of its "
        "defaults; repeatable",
        readable=False,
    ),
]


def sim(  # noqa: PLR0917 (one parameter per CLI option)
    scenario: Annotated[str | None, typer.Option(help=_SCENARIO_HELP)] = None,
    strategies: Annotated[str, typer.Option(help="comma-separated strategy names")] = (
        DEFAULT_STRATEGIES
    ),
    trace: _TraceOpt = None,
    traces_dir: _TracesDirOpt = None,
    instances: Annotated[int | None, typer.Option(min=1, max=MAX_INSTANCES)] = None,
    preset: Annotated[str | None, typer.Option(help="engine preset")] = None,
    seed: Annotated[int | None, typer.Option()] = None,
    json_out: _JsonOpt = None,
    report: _ReportOpt = None,
    requests: Annotated[int | None, typer.Option(min=1, help="keep the first N requests")] = None,
    rate: Annotated[float | None, typer.Option(min=1e-6, help="offered load, requests/s")] = None,
    concurrency: _ConcurrencyOpt = None,
    gateway_replicas: _GatewayReplicasOpt = "1",
    sync_delay_ms: _SyncDelayOpt = "0",
    sessions: _SessionsOpt = False,
    flow: _FlowOpt = None,
    kv_events_delay_ms: _KvEventsDelayOpt = None,
    strategy_config: _StrategyConfigOpt = None,
    fmt: FormatOpt = OutputFormat.table,
    wide: WideOpt = False,
) -> None:
    """Compare routing strategies on a simulated fleet (virtual time); with
    --gateway-replicas/--sync-delay-ms, the hit rate per (replicas, delay) instead."""
    if concurrency is not None and rate is not None:
        raise typer.BadParameter("give at most one of --concurrency and --rate")
    if flow is not None and gateway_replicas != "1":
        raise typer.BadParameter("--flow runs with one gateway replica")
    cells = _sweep_cells(gateway_replicas, sync_delay_ms, fmt, report)
    try:
        check_outputs(json_out, report)
        inputs = _read_inputs(
            strategies, strategy_config, flow, kv_events_delay_ms,
            scenario=scenario, trace=trace, traces_dir=traces_dir,
            overrides=(instances, preset, seed, requests), sessions=sessions,
        )  # fmt: skip
        outcome = _simulate(inputs, cells, rate=rate, concurrency=concurrency, fmt=fmt)
        if isinstance(outcome, ReplicaSweep):
            _emit_sweep(outcome, json_out, fmt)
            return
    except WarmfleetError as err:
        typer.echo(f"error: {one_line(str(err))}", err=True)  # one line, never wrapped
        raise typer.Exit(2) from err
    _emit(outcome, json_out, report, fmt, wide)


def _sweep_cells(
    gateway_replicas: str, sync_delay_ms: str, fmt: OutputFormat, report: Path | None
) -> tuple[list[int], list[float | None]] | None:
    """The gateway replicas and sync delays to sweep, or None for the comparison (one gateway,
    no delay); a sweep prints no TSV and draws no plots."""
    counts, delays = replica_counts(gateway_replicas), sync_delays(sync_delay_ms)
    if counts == [1] and delays == [0.0]:
        return None
    if fmt == OutputFormat.tsv:
        raise typer.BadParameter("--format tsv is for one gateway; use json with replicas")
    if report is not None:
        raise typer.BadParameter("--report (plots) is for one gateway; use --json with replicas")
    return counts, delays


@dataclass(frozen=True)
class _Inputs:
    """What a run reads before it starts: its scenario and trace, the strategies with their
    settings, and the flow control in front (None: none)."""

    spec: ScenarioSpec
    trace: Trace | None
    names: list[str]
    configs: dict[str, StrategyConfig]
    flow: FlowControlConfig | None


def _read_inputs(
    strategies: str,
    strategy_config: list[Path] | None,
    flow: Path | None,
    kv_events_delay_ms: float | None,
    *,
    scenario: str | None,
    trace: Path | None,
    traces_dir: Path | None,
    overrides: tuple[int | None, str | None, int | None, int | None],
    sessions: bool,
) -> _Inputs:
    """The strategies, their settings files, the flow-control file, then the scenario and its
    trace (``overrides``: --instances, --preset, --seed, --requests)."""
    names = parse_strategies(strategies)
    configs = strategy_configs(strategy_config or [], names)
    flow_config = None
    if flow is not None:
        doc = load_yaml_file(flow)
        flow_config = parse_document(FlowControlConfig, doc, str(flow))
    spec, trace_data = spec_and_trace(scenario, trace, traces_dir, overrides, sessions)
    spec = with_kv_events(spec, kv_events_delay_ms)
    return _Inputs(spec, trace_data, names, configs, flow_config)


def _simulate(
    inputs: _Inputs,
    cells: tuple[list[int], list[float | None]] | None,
    *,
    rate: float | None,
    concurrency: int | None,
    fmt: OutputFormat,
) -> Comparison | ReplicaSweep:
    """The comparison (``cells`` None), else the replica sweep over ``cells``, with progress."""
    with activity_for(fmt) as activity:
        progress = PhasedProgress(activity)
        outcome: Comparison | ReplicaSweep
        if cells is not None:
            counts, delays = cells
            outcome = run_replica_sweep(
                inputs.spec, inputs.names, counts, delays,
                trace=inputs.trace, rate_rps=rate, concurrency=concurrency,
                progress=progress, on_workload=_workload_line(fmt), configs=inputs.configs,
            )  # fmt: skip
        else:
            outcome = run_comparison(
                inputs.spec, inputs.names, trace=inputs.trace, rate_rps=rate,
                concurrency=concurrency, progress=progress, on_workload=_workload_line(fmt),
                flow=inputs.flow, configs=inputs.configs,
            )  # fmt: skip
        progress.close()
    return outcome


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
    report: Annotated[Path, typer.Option(help="output directory", readable=False)] = Path(
        "warmfleet-report"
    ),
    fmt: FormatOpt = OutputFormat.table,
    wide: WideOpt = False,
) -> None:
    """Simulator-only demo: the four strategies on a scaled-down aws-long-context (virtual time)."""
    check_output_dir(report, "--report")  # before the run, not after it
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
