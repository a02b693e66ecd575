"""`warmfleet doctor TRACE`: replay a trace (a capture, or any trace in warmfleet's format) under
every strategy on its fleet and explain the KV reuse it gets (docs/doctor.md).

The edge part only: read the file, show progress, print and write. The replays and the figures
are ``sim.doctor_run`` / ``sim.doctor`` (pure).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from warmfleet.api.replica_sync import DEFAULT_BATCH_INTERVAL_MS
from warmfleet.api.trace_format import MAX_INSTANCES, TraceFile
from warmfleet.bench.doctor_report import doctor_lines, doctor_tables, write_doctor_report
from warmfleet.bench.progress import PhasedProgress, activity_for
from warmfleet.bench.report import write_json
from warmfleet.bench.sim_inputs import check_outputs, sync_delays, with_kv_events
from warmfleet.core.errors import WarmfleetError
from warmfleet.core.failures import one_line
from warmfleet.display import FormatOpt, OutputFormat, WideOpt, chatter_console, emit
from warmfleet.edge import read_text_file
from warmfleet.sim.doctor import churn_of
from warmfleet.sim.doctor_run import DoctorResult, run_doctor
from warmfleet.sim.doctor_sweeps import parse_objective, parse_target
from warmfleet.sim.gateways import GatewaySync
from warmfleet.sim.trace_fleet import trace_scenario
from warmfleet.sim.workloads.traces import Trace, parse_trace_text


def _gateways(replicas: int, sync_delay_ms: str) -> GatewaySync | None:
    """``--gateway-replicas``/``--sync-delay-ms`` (one value each): None for one gateway."""
    delays = sync_delays(sync_delay_ms)
    if len(delays) != 1:
        raise typer.BadParameter(f"--sync-delay-ms: one value, got {sync_delay_ms!r}")
    if replicas == 1:
        return None
    return GatewaySync(replicas, None if delays[0] is None else delays[0] / 1000.0)


def _diagnose(
    trace: Path,
    instances: int | None,
    preset: str | None,
    target: str | None,
    fmt: OutputFormat,
    *,
    gateways: GatewaySync | None,
    kv_events_delay_ms: float | None = None,
    objective: str | None = None,
    requests: int | None = None,
) -> DoctorResult:
    goal = parse_target(target) if target is not None else None
    aim = parse_objective(objective) if objective is not None else None
    data = Trace(read_text_file(trace), str(trace))
    parsed = parse_trace_text(data)
    if requests is not None:  # the first N, in the file's order (the replay takes as many)
        parsed = TraceFile(parsed.header, parsed.records[:requests], parsed.has_header)
    churn = churn_of(parsed.records)
    at_start = churn.instances_seen - len(churn.joins)
    spec = trace_scenario(
        data, parsed.header, instances=instances, preset=preset, seen_instances=at_start or None
    )
    spec = with_kv_events(spec, kv_events_delay_ms)
    with activity_for(fmt) as activity:
        progress = PhasedProgress(activity)
        result = run_doctor(spec, data, parsed, goal, progress, gateways=gateways, objective=aim)
        progress.close()
    return result


# The options of `doctor`, each longer than a line, so its signature reads as the option list.
# Path options say readable=False: the command reads (and writes) them itself, so a refused read
# is its one line, not click's box.
_TraceArg = Annotated[
    Path, typer.Argument(help="a trace in warmfleet's format (or Mooncake's)", readable=False)
]
_InstancesOpt = Annotated[
    int | None,
    typer.Option(min=1, max=MAX_INSTANCES, help="instances (else the trace header's, else 8)"),
]
_PresetOpt = Annotated[
    str | None, typer.Option(help="engine preset (else the header's, else llama-3.1-70b-p5)")
]
_JsonOpt = Annotated[Path | None, typer.Option("--json", help="write the result", readable=False)]
_ReportOpt = Annotated[
    Path | None,
    typer.Option(help="directory for doctor.md, doctor.json, waterfall.png", readable=False),
]
_TargetOpt = Annotated[
    str | None, typer.Option(help="hit_rate=0.6 or p95_ttft_ms=800: size the fleet for it")
]
_ObjectiveOpt = Annotated[
    str | None,
    typer.Option(
        help="what the recommended strategy is best at: p95_ttft_ms (the lowest P95 TTFT) or "
        "hit_rate (default: the target's metric, else p95_ttft_ms)"
    ),
]
_GatewayReplicasOpt = Annotated[
    int,
    typer.Option(
        min=1, max=MAX_INSTANCES, help="gateway replicas, each request reaching a random one"
    ),
]
_SyncDelayOpt = Annotated[
    str,
    typer.Option(
        help="the replicas' sync delay in ms ('none': replicas without sync; default: the "
        "live gateway's batchIntervalMs)"
    ),
]
_RequestsOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="replay the first N requests of the trace (the replays' memory grows with the "
        "requests: docs/doctor.md)",
    ),
]
_KvEventsDelayOpt = Annotated[
    float | None,
    typer.Option(
        min=0.0,
        help="the engines publish KV events, reaching the gateway this many ms later "
        "(as vLLM with --kv-events-config; default: none)",
    ),
]


def doctor(  # noqa: PLR0917 (one parameter per CLI option)
    trace: _TraceArg,
    instances: _InstancesOpt = None,
    preset: _PresetOpt = None,
    json_out: _JsonOpt = None,
    report: _ReportOpt = None,
    target: _TargetOpt = None,
    objective: _ObjectiveOpt = None,
    gateway_replicas: _GatewayReplicasOpt = 1,
    sync_delay_ms: _SyncDelayOpt = f"{DEFAULT_BATCH_INTERVAL_MS:g}",
    kv_events_delay_ms: _KvEventsDelayOpt = None,
    requests: _RequestsOpt = None,
    fmt: FormatOpt = OutputFormat.table,
    wide: WideOpt = False,
) -> None:
    """Replay a trace under every strategy and explain its KV reuse: a waterfall from the ideal
    to what the fleet delivered, the largest loss and what closes it, recommendations."""
    gateways = _gateways(gateway_replicas, sync_delay_ms)
    try:
        check_outputs(json_out, report)  # before the replays, not after them
        result = _diagnose(
            trace, instances, preset, target, fmt, gateways=gateways,
            kv_events_delay_ms=kv_events_delay_ms, objective=objective, requests=requests,
        )  # fmt: skip
    except WarmfleetError as err:
        typer.echo(f"error: {one_line(str(err))}", err=True)  # one line, never wrapped
        raise typer.Exit(2) from err
    _emit(result.report(), json_out, report, fmt, wide)


def _emit(
    document: dict[str, object],
    json_out: Path | None,
    report: Path | None,
    fmt: OutputFormat,
    wide: bool,
) -> None:
    """The tables (or TSV/JSON on stdout), the findings under a table, then the files."""
    console = chatter_console(fmt)
    emit(doctor_tables(document), fmt, wide=wide, document=document)
    if fmt == OutputFormat.table:
        for line in doctor_lines(document):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    if json_out is not None:
        write_json(document, json_out)
        console.print(f"wrote {json_out}")
    if report is not None:
        for path in write_doctor_report(document, report):
            console.print(f"wrote {path}")


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
