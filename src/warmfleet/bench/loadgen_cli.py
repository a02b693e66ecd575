"""`warmfleet bench` (live load generator) and `warmfleet demo` (the live demo, `make demo`).

``bench`` checks its URLs and picks the model before any load (``loadgen_preflight``); its
expected failures are one line and exit 2 (the root command prints them). After the run it prints
each error class with a sample message, and exits 1 when more than ``--max-error-share`` of the
requests failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from warmfleet.bench.loadgen import ApiKind, LoadResult, LoadSpec
from warmfleet.bench.loadgen_errors import error_lines, too_many_errors
from warmfleet.bench.loadgen_metrics import MetricsTarget, measure
from warmfleet.bench.loadgen_preflight import check_base_url, metrics_target, preflight
from warmfleet.bench.progress import activity_for
from warmfleet.bench.sim_inputs import check_outputs, read_trace
from warmfleet.bench.terminal import progress_bar, run_async
from warmfleet.display import FormatOpt, OutputFormat, WideOpt, chatter_console
from warmfleet.edge import read_text_file
from warmfleet.sim.scenario import (
    BuiltWorkload,
    ScenarioSpec,
    build_workload,
    builtin_scenario,
    engine_spec,
    parse_scenario,
)
from warmfleet.sim.workloads.base import WorkloadRequest


def scenario_requests(
    name: str,
    requests: int,
    *,
    concurrency: int | None,
    rate_rps: float | None,
    preset: str | None = None,
    instances: int | None = None,
    seed: int = 0,
) -> tuple[ScenarioSpec, BuiltWorkload]:
    """The first ``requests`` requests of a built-in or YAML scenario, timed by its arrivals
    (``source`` says whether a trace or its synthetic equivalent ran)."""
    if name.endswith((".yaml", ".yml")) or Path(name).is_file():
        spec = parse_scenario(read_text_file(Path(name)), name)
    else:
        spec = builtin_scenario(name, 8, "llama-3.1-70b-p5", seed)
    updates: dict[str, Any] = {"requests": requests, "seed": seed}
    if preset is not None:
        updates["preset"] = preset
    if instances is not None:
        updates["instances"] = instances
    if concurrency is not None:
        updates["arrival"] = {"type": "closed", "concurrency": concurrency}
    data = spec.model_dump(by_alias=True)
    data.update(updates)
    spec = ScenarioSpec.model_validate(data)
    built = build_workload(spec, engine_spec(spec), trace=read_trace(spec), rate_rps=rate_rps)
    return spec, built


def instance_name(url: str, targets: list[MetricsTarget]) -> str:
    """The id of the metrics target served by ``url`` (same scheme://host:port), else the URL."""
    for target in targets:
        if target.url.startswith(url + "/"):
            return target.instance
    return url


# The options of `bench` that take more than a line, so its signature reads as the option list.
_MetricsUrlOpt = Annotated[
    list[str] | None, typer.Option(help="engine /metrics URL (ID=URL); repeat per instance")
]
_JsonOpt = Annotated[
    Path | None, typer.Option("--json", help="write the JSON report", readable=False)
]
_ReportOpt = Annotated[
    Path | None, typer.Option(help="directory for report.json/md and PNGs", readable=False)
]
_ModelOpt = Annotated[
    str | None,
    typer.Option(help="model name sent in requests (default: the one GET /v1/models lists)"),
]
_MaxErrorShareOpt = Annotated[
    float,
    typer.Option(min=0.0, max=1.0, help="exit 1 when more than this share of requests fails"),
]


def bench(  # noqa: PLR0917 (one parameter per CLI option)
    url: Annotated[list[str], typer.Option(help="base URL; repeat for client-side round robin")],
    scenario: Annotated[str, typer.Option(help="built-in scenario name or a Scenario YAML")],
    requests: Annotated[int, typer.Option(min=1, help="number of requests")] = 200,
    concurrency: Annotated[int | None, typer.Option(min=1, help="closed loop, N clients")] = None,
    rate: Annotated[float | None, typer.Option(min=1e-6, help="open loop, requests/s")] = None,
    stream: Annotated[bool, typer.Option(help="SSE streaming (measures TTFT and ITL)")] = False,
    metrics_url: _MetricsUrlOpt = None,
    json_out: _JsonOpt = None,
    report: _ReportOpt = None,
    model: _ModelOpt = None,
    api: Annotated[str, typer.Option(help="chat or completions")] = "chat",
    max_output_tokens: Annotated[int | None, typer.Option(min=1)] = None,
    ignore_eos: Annotated[bool, typer.Option(help="send ignore_eos (vLLM extension)")] = False,
    max_duration_s: Annotated[float, typer.Option(min=0.1)] = 300.0,
    timeout_s: Annotated[float, typer.Option(min=0.1, help="per-request timeout")] = 120.0,
    preset: Annotated[str | None, typer.Option(help="engine preset sizing the workload")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    label: Annotated[str, typer.Option(help="name of this run in the report")] = "run",
    max_error_share: _MaxErrorShareOpt = 0.0,
    fmt: FormatOpt = OutputFormat.table,
    wide: WideOpt = False,
) -> None:
    """Drive a workload against OpenAI-compatible URLs (a gateway, a router, engines)."""
    api_kind = _api_kind(api, concurrency=concurrency, rate=rate)
    targets = [metrics_target(m) for m in metrics_url or ()]
    urls = tuple(check_base_url(u) for u in url)
    check_outputs(json_out, report)  # before the load, not after it
    spec, built = scenario_requests(
        scenario, requests, concurrency=concurrency, rate_rps=rate, preset=preset, seed=seed
    )
    _say_workload(spec, built, requests, fmt)
    load_spec = LoadSpec(
        urls=urls,
        url_names=tuple(instance_name(u, targets) for u in urls) if len(urls) > 1 else (),
        model=run_async(preflight(urls, model)),
        api=api_kind,
        stream=stream,
        concurrency=concurrency,
        max_duration_s=max_duration_s,
        request_timeout_s=timeout_s,
        max_output_tokens=max_output_tokens,
        ignore_eos=ignore_eos,
    )
    load, summary, unscraped = _measure(
        built.requests, load_spec, targets, spec.name, label=label, fmt=fmt
    )
    meta = _run_meta(spec, built, load_spec, len(targets), seed=seed, rate=rate)
    _report(meta, label, load, summary, json_out=json_out, report=report, fmt=fmt, wide=wide)
    _judge_errors(summary, max_error_share, unscraped)


def _api_kind(api: str, *, concurrency: int | None, rate: float | None) -> ApiKind:
    """The ``--api`` kind, once the flags are checked (at most one of ``--concurrency`` and
    ``--rate``)."""
    if concurrency is not None and rate is not None:
        raise typer.BadParameter("give at most one of --concurrency and --rate")
    if api not in ("chat", "completions"):
        raise typer.BadParameter("--api must be chat or completions")
    return "chat" if api == "chat" else "completions"


def _say_workload(
    spec: ScenarioSpec, built: BuiltWorkload, requests: int, fmt: OutputFormat
) -> None:
    """What ran when it is not the generated workload, and fewer requests than asked for."""
    workload = built.requests
    notes = [] if built.source == "generated" else [f"workload: {built.source}"]
    if len(workload) < requests:  # a trace's rows, or a generator's fixed set, run out
        notes.append(f"workload: {spec.name} has {len(workload)} requests, not {requests}")
    for note in notes:
        chatter_console(fmt).print(note, markup=False, highlight=False, soft_wrap=True)


def _measure(
    workload: Sequence[WorkloadRequest],
    load_spec: LoadSpec,
    targets: list[MetricsTarget],
    scenario_name: str,
    *,
    label: str,
    fmt: OutputFormat,
) -> tuple[LoadResult, dict[str, object], list[str]]:
    """The load under a progress bar: its results, their summary, and the ``--metrics-url``
    targets that could not be scraped."""
    with activity_for(fmt) as activity:
        target = f"{', '.join(load_spec.urls)} (model {load_spec.model})"
        activity.log(f"{len(workload)} requests of {scenario_name} to {target}")
        unscraped: list[str] = []
        with progress_bar(len(workload), label, activity) as on_done:
            load, summary = run_async(
                measure(
                    workload, load_spec, targets, on_done=on_done, on_unscraped=unscraped.extend
                )
            )
    return load, summary, unscraped


def _run_meta(
    spec: ScenarioSpec,
    built: BuiltWorkload,
    load_spec: LoadSpec,
    instances: int,
    *,
    seed: int,
    rate: float | None,
) -> dict[str, Any]:
    """The report's description of the run (``instances``: the ``--metrics-url`` targets)."""
    return {
        "scenario": spec.name,
        "workload": built.source,
        "preset": spec.preset,
        "seed": seed,
        "requests": len(built.requests),
        "instances": instances or None,
        "closed_loop_concurrency": load_spec.concurrency,
        "rate_rps": rate,
        "stream": load_spec.stream,
        "urls": list(load_spec.urls),
    }


def _report(
    meta: dict[str, Any],
    label: str,
    load: LoadResult,
    summary: dict[str, object],
    *,
    json_out: Path | None,
    report: Path | None,
    fmt: OutputFormat,
    wide: bool,
) -> None:
    """The run's table (or TSV/JSON), then the JSON report and the report directory."""
    # Reports pull in matplotlib: imported here so other commands start fast.
    from warmfleet.bench.loadgen_report import (  # noqa: PLC0415
        comparison_report,
        print_runs,
        write_report,
    )
    from warmfleet.bench.report import write_json  # noqa: PLC0415

    result = comparison_report(meta, {label: summary})
    print_runs(result, fmt=fmt, wide=wide)
    if json_out is not None:
        write_json(result, json_out)
    if report is not None:
        write_report(result, {label: load}, report, f"warmfleet bench: {meta['scenario']}")


def _judge_errors(
    summary: dict[str, Any], max_error_share: float, unscraped: Sequence[str] = ()
) -> None:
    """The ``--metrics-url`` targets that could not be scraped (one line), each error class with
    its count and a sample message (stderr); exit 1 when more than ``max_error_share`` of the
    sent requests failed."""
    if unscraped:
        typer.echo(
            f"warmfleet bench: warning: no metrics from --metrics-url {', '.join(unscraped)} "
            "(unreachable or not Prometheus text, before or after the run): the engine figures "
            "leave them out",
            err=True,
        )
    for line in error_lines(summary):
        typer.echo(f"warmfleet bench: {line}", err=True)
    verdict = too_many_errors(summary, max_error_share)
    if verdict is not None:
        typer.echo(f"warmfleet bench: {verdict}", err=True)
        raise typer.Exit(1)


def demo_live(  # noqa: PLR0917 (one parameter per CLI option)
    report: Annotated[Path, typer.Option(help="output directory", readable=False)] = Path(
        "warmfleet-report"
    ),
    requests: Annotated[int, typer.Option(min=8, help="requests per strategy")] = 240,
    concurrency: Annotated[int, typer.Option(min=1)] = 8,
    speedup: Annotated[float, typer.Option(min=0.1, help="emulated engine speed-up")] = 2.0,
    fmt: FormatOpt = OutputFormat.table,
    wide: WideOpt = False,
) -> None:
    """Live demo: emulated fleet + gateway, four strategies, comparison table and report."""
    from warmfleet.bench.live_demo import main_live_demo  # noqa: PLC0415 (heavy imports)

    check_outputs(None, report)  # before the fleet starts, not after the runs
    main_live_demo(
        report, requests=requests, concurrency=concurrency, speedup=speedup, fmt=fmt, wide=wide
    )


def register(app: typer.Typer) -> None:
    """``warmfleet bench`` and ``warmfleet demo``."""
    app.command("bench")(bench)
    app.command("demo")(demo_live)
