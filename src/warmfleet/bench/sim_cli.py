"""`warmfleet sim` (simulator comparison) and `warmfleet demo-sim` (its quick four-strategy run)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
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
from warmfleet.routing.flow_config import FlowControlConfig
from warmfleet.sim.replica_sweep import ReplicaSweep, run_replica_sweep
from warmfleet.sim.runner import Comparison, run_comparison
from warmfleet.sim.scenario import BUILTIN_WORKLOADS, BuiltWorkload, ScenarioSpec
from warmfleet.sim.workloads.arrivals import PoissonArrival
from warmfleet.sim.workloads.synthetic import AwsLongContextConfig

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
# Every Path option says readable=False: the command reads (and writes) them itself, so a
# refused read is its one line, not click's box (click checks before the command's handler).


def sim(  # noqa: PLR0917 (one parameter per CLI option)
    scenario: Annotated[str | None, typer.Option(help=_SCENARIO_HELP)] = None,
    strategies: Annotated[str, typer.Option(help="comma-separated strategy names")] = (
        DEFAULT_STRATEGIES
    ),
    trace: Annotated[
        Path | None,
        typer.Option(
            help="trace file: of a trace-driven scenario, or alone a warmfleet trace",
            readable=False,
        ),
    ] = None,
    traces_dir: Annotated[
        Path | None,
        typer.Option(
            help=f"directory of the default trace files (else ${TRACES_DIR_ENV}, "
            "else ../shared/traces from the current directory)",
            readable=False,
        ),
    ] = None,
    instances: Annotated[int | None, typer.Option(min=1, max=MAX_INSTANCES)] = None,
    preset: Annotated[str | None, typer.Option(help="engine preset")] = None,
    seed: Annotated[int | None, typer.Option()] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="write the JSON report", readable=False)
    ] = None,
    report: Annotated[
        Path | None, typer.Option(help="directory for report.json and PNGs", readable=False)
    ] = None,
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
        typer.Option(
            help="flow-control YAML (routing.flow, docs/flow-control.md) in front", readable=False
        ),
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
            "defaults; repeatable",
            readable=False,
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
    counts, delays = replica_counts(gateway_replicas), sync_delays(sync_delay_ms)
    sweep = counts != [1] or delays != [0.0]
    if sweep and fmt == OutputFormat.tsv:
        raise typer.BadParameter("--format tsv is for one gateway; use json with replicas")
    if sweep and report is not None:
        raise typer.BadParameter("--report (plots) is for one gateway; use --json with replicas")
    try:
        check_outputs(json_out, report)
        names = parse_strategies(strategies)
        configs = strategy_configs(strategy_config or [], names)
        flow_config = None
        if flow is not None:
            doc = load_yaml_file(flow)
            flow_config = parse_document(FlowControlConfig, doc, str(flow))
        spec, trace_data = spec_and_trace(
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
