"""`make bench-peers`: warmfleet beside sglang-router and vllm-router, same fleet, one run.

Overhead points run against ONE fast emulated fleet (engine time ~0, so the router is what is
measured), each router started fresh in front of it in turn; "added" latency is the router's
minus direct's (client round robin) at the same load point in the same run, and router CPU is
the router process tree's CPU time over the measured requests. The switchback part runs the
routers of issue 22's lines at once in front of one fast fleet, the load rotating between them
slice by slice (``peers_switchback``): the same lines, measured under the same machine, with
95 % intervals. Quality points run against a fresh slow fleet per router (cold caches, KV
smaller than the shared prefixes) so hit rate, TTFT and balance reflect placement. Every child
is stopped by PID on every exit path.

    python -m warmfleet.bench.peers --out bench-results/peers.json \\
        --sglang-python .venv-peers-sglang/bin/python --vllm-router .venv-peers-vllm/bin/vllm-router
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import typer

from warmfleet.bench.cpu_probe import CpuProbe
from warmfleet.bench.live_demo import DemoConfig, demo_workload, kv_capacity_tokens
from warmfleet.bench.live_fleet import FleetHandle, start_fleet
from warmfleet.bench.live_procs import ProcessSet, terminate_on_sigterm
from warmfleet.bench.loadgen import LoadSpec, run_load
from warmfleet.bench.loadgen_metrics import measure
from warmfleet.bench.peers_report import (
    RowInput,
    acceptance,
    acceptance_table,
    build_rows,
    median_rows,
    rows_table,
)
from warmfleet.bench.peers_routers import (
    CAPTURED_PREFIX_AFFINITY,
    FLOWED_PREFIX_AFFINITY,
    PASSTHROUGH,
    PROTOCOL_PASSTHROUGH,
    REFERENCE_PROXIES,
    SYNCED_PREFIX_AFFINITY,
    PeerPaths,
    RouterSpec,
    RunningRouter,
    start_router,
)
from warmfleet.bench.peers_switchback import switchback_part
from warmfleet.bench.peers_switchback_report import switch_acceptance_table, switch_table
from warmfleet.bench.report import write_json
from warmfleet.bench.terminal import progress_bar, run_async
from warmfleet.display import WideOpt, emit, output_console
from warmfleet.sim.workloads.base import Segment, WorkloadRequest, render_segment_text
from warmfleet.sim.workloads.synthetic import GspConfig, gsp

INSTANCES = 4
PROMPT_CHARS = 8000
SHARED_FRACTION = 0.75
GROUPS = 8


@dataclass(frozen=True)
class LoadPoint:
    name: str
    concurrency: int
    stream: bool
    requests: int
    max_s: float
    warmup: int


# Each point runs for a few seconds, and each part (overhead, quality) runs ``ROUNDS`` times
# (rows are medians over rounds): the machine's speed swings by tens of percent within a minute,
# so one short window per router (the first version) made the "added" figures mostly noise.
OVERHEAD_POINTS = (
    LoadPoint("c1_8k", 1, False, 600, 10.0, 4),
    LoadPoint("c32_8k", 32, False, 3000, 12.0, 64),
    LoadPoint("stream_c32_8k", 32, True, 2000, 12.0, 64),
    LoadPoint("c64_8k", 64, False, 4000, 12.0, 64),
)
ROUNDS = 3
QUALITY_POINTS = (
    LoadPoint("quality_c16", 16, True, 480, 60.0, 0),
    LoadPoint("quality_c1", 1, True, 32, 30.0, 0),
)
# Variants of prefix_affinity whose targets are on the request path only (replica sync, capture,
# flow control without overload): measured on the overhead points, not on the quality ones
# (same routing, same hit rate).
OVERHEAD_ONLY = frozenset(
    {SYNCED_PREFIX_AFFINITY, CAPTURED_PREFIX_AFFINITY, FLOWED_PREFIX_AFFINITY}
)
ROUTERS = (
    RouterSpec("direct", "client_round_robin"),
    RouterSpec(PASSTHROUGH, "round_robin"),
    RouterSpec(PROTOCOL_PASSTHROUGH, "round_robin"),
    RouterSpec("warmfleet", "prefix_affinity"),
    RouterSpec("warmfleet", SYNCED_PREFIX_AFFINITY),
    RouterSpec("warmfleet", CAPTURED_PREFIX_AFFINITY),
    RouterSpec("warmfleet", FLOWED_PREFIX_AFFINITY),
    RouterSpec("warmfleet", "random"),
    RouterSpec("sglang-router", "cache_aware"),
    RouterSpec("sglang-router", "round_robin"),
    RouterSpec("vllm-router", "round_robin"),
    RouterSpec("vllm-router", "cache_aware"),
)
FAST_FLEET = {"preset": "tiny-cpu", "speedup": 10_000.0, "seed": 0}
SWITCH_REQUESTS = 4000  # the switchback's requests, sent round and round
PARTS = ("overhead", "switchback", "quality")
QUALITY = DemoConfig(instances=INSTANCES, concurrency=16, requests=480)


def overhead_workload(count: int, seed: int = 7) -> tuple[WorkloadRequest, ...]:
    """~8,000-character prompts: 8 shared prefixes (75 %) plus a unique question (gsp shape)."""
    chars_per_word = len(render_segment_text(Segment(1, 2000))) / 2000
    shared = round(SHARED_FRACTION * PROMPT_CHARS / chars_per_word)
    question = round((1 - SHARED_FRACTION) * PROMPT_CHARS / chars_per_word)
    per_group = -(-count // GROUPS)
    config = GspConfig(
        groups=GROUPS, prompts_per_group=per_group, system_prompt_tokens=shared,
        question_tokens=question, output_tokens=16,
    )  # fmt: skip
    return gsp(config, seed)[:count]


def _load_spec(router: RunningRouter, fleet: FleetHandle, point: LoadPoint) -> LoadSpec:
    urls, names = ((router.url,), ()) if router.url else (fleet.urls, fleet.ids)
    return LoadSpec(
        urls=urls, url_names=names, model=fleet.model, stream=point.stream,
        concurrency=point.concurrency, max_duration_s=point.max_s, request_timeout_s=60.0,
        ignore_eos=True, max_output_tokens=16,
    )  # fmt: skip


async def run_point(
    router: RunningRouter,
    fleet: FleetHandle,
    point: LoadPoint,
    requests: Sequence[WorkloadRequest],
    scenario: str,
) -> RowInput:
    """Warm up (not recorded), then measure one load point through ``router``."""
    spec = _load_spec(router, fleet, point)
    if point.warmup:
        await run_load(requests[: point.warmup], replace(spec, max_duration_s=30.0))
    measured = requests[point.warmup :]
    probe = CpuProbe(tuple(c.pid for c in router.children), fleet.child.pid)
    probe.start()
    with progress_bar(len(measured), f"{router.spec.label} {point.name}") as on_done:
        load, summary = await measure(
            measured, spec, fleet.metrics_targets, instances=fleet.ids, on_done=on_done
        )
    probe.stop()
    return RowInput(
        router.spec.router, router.spec.policy, point.name, scenario, point.concurrency,
        point.stream, summary, probe.router_s, len(load.results), probe.foreign_frac,
        probe.fleet_s, probe.client_s, probe.busy_frac,
    )  # fmt: skip


def round_order(routers: Sequence[RouterSpec], round_index: int) -> list[RouterSpec]:
    """``routers`` in even rounds, reversed in odd ones: no router always runs at the same
    point of the machine's drift."""
    return list(reversed(routers)) if round_index % 2 else list(routers)


def overhead_order(routers: Sequence[RouterSpec], round_index: int) -> list[RouterSpec]:
    """Direct first and after every router (it brackets each, see ``peers_report``); the
    routers in ``round_order``."""
    direct = [r for r in routers if r.router == "direct"]
    order: list[RouterSpec] = list(direct)
    for spec in round_order([r for r in routers if r.router != "direct"], round_index):
        order += [spec, *direct]
    return order


async def run_overhead(
    procs: ProcessSet,
    paths: PeerPaths,
    routers: Sequence[RouterSpec],
    scale: float,
    rounds: int = ROUNDS,
) -> list[list[RowInput]]:
    """Every router x overhead point, ``rounds`` times; one list of rows per round."""
    fleet = await start_fleet(procs, name="fleet-fast", instances=INSTANCES, spec=FAST_FLEET)
    points = [_scaled(p, scale) for p in OVERHEAD_POINTS]
    workload = overhead_workload(max(p.requests + p.warmup for p in points))
    out: list[list[RowInput]] = []
    for round_index in range(rounds):
        rows: list[RowInput] = []
        for spec in overhead_order(routers, round_index):
            router = await start_router(procs, spec, paths, fleet)
            try:
                for point in points:
                    requests = workload[: point.requests + point.warmup]
                    rows.append(await run_point(router, fleet, point, requests, "gsp-8k-chars"))
            finally:
                for child in router.children:
                    procs.stop(child)
        out.append(rows)
    procs.stop(fleet.child)
    return out


async def run_quality(
    procs: ProcessSet,
    paths: PeerPaths,
    routers: Sequence[RouterSpec],
    scale: float,
    rounds: int = ROUNDS,
) -> list[list[RowInput]]:
    """Every router x quality point on a fresh fleet each, ``rounds`` times (``round_order``);
    one list of rows per round."""
    config = replace(QUALITY, requests=max(16, int(QUALITY.requests * scale)))
    requests = demo_workload(config)
    fleet_spec = {"preset": config.preset, "speedup": config.speedup, "seed": config.seed,
                  "kvCapacityTokens": kv_capacity_tokens(requests, config)}  # fmt: skip
    routers = [r for r in routers if r.router not in REFERENCE_PROXIES]  # overhead only
    out: list[list[RowInput]] = []
    for round_index in range(rounds):
        rows: list[RowInput] = []
        for point in (_scaled(p, scale) for p in QUALITY_POINTS):
            for spec in round_order(routers, round_index):
                fleet = await start_fleet(
                    procs, name="fleet-quality", instances=INSTANCES, spec=fleet_spec
                )
                router = await start_router(procs, spec, paths, fleet)
                try:
                    chosen = requests[: point.requests]
                    rows.append(await run_point(router, fleet, point, chosen, "aws-long-context"))
                finally:
                    procs.stop_all()
        out.append(rows)
    return out


def _scaled(point: LoadPoint, scale: float) -> LoadPoint:
    if scale >= 1.0:
        return point
    return replace(point, requests=max(8, int(point.requests * scale)))


async def run_peers(
    out: Path,
    paths: PeerPaths,
    *,
    routers: Sequence[RouterSpec] = ROUTERS,
    scale: float = 1.0,
    log_dir: Path | None = None,
    parts: Sequence[str] = PARTS,
    rounds: int = ROUNDS,
) -> dict[str, Any]:
    """Every router x load point; writes ``out`` and returns the document. Every row is the
    median over ``rounds`` runs of its part (``median_rows``)."""
    wanted = [r for r in routers if paths.available(r)]
    skipped = [r.label for r in routers if not paths.available(r)]
    logs = log_dir or Path(tempfile.mkdtemp(prefix="warmfleet-peers-"))
    procs = ProcessSet(logs)
    started = time.perf_counter()
    try:
        overhead: list[list[RowInput]] = []
        quality: list[list[RowInput]] = []
        switchback: dict[str, Any] | None = None
        if "overhead" in parts:
            overhead = await run_overhead(procs, paths, wanted, scale, rounds)
        if "switchback" in parts:
            switchback = await switchback_part(
                procs, paths, wanted, overhead_workload(SWITCH_REQUESTS),
                fleet_spec=FAST_FLEET, instances=INSTANCES, scale=scale,
            )  # fmt: skip
        if "quality" in parts:
            judged = [r for r in wanted if r.policy not in OVERHEAD_ONLY]
            quality = await run_quality(procs, paths, judged, scale, rounds)
    finally:
        procs.stop_all()
    rows = median_rows([build_rows(r, INSTANCES) for r in overhead])
    rows += median_rows([build_rows(r, INSTANCES) for r in quality])
    ran = {"overhead": len(overhead), "quality": len(quality)}
    document = _document(rows, skipped, switchback, ran, scale=scale, logs=logs, started_s=started)
    write_json(document, out)
    return document


def _document(
    rows: list[dict[str, Any]],
    skipped: list[str],
    switchback: dict[str, Any] | None,
    rounds: dict[str, int],
    *,
    scale: float,
    logs: Path,
    started_s: float,
) -> dict[str, Any]:
    """``bench-results/peers.json``: ``rounds`` each part ran."""
    return {
        "machine": {"cpus": _cpus(), "python": platform.python_version()},
        "instances": INSTANCES,
        "overhead_fleet": FAST_FLEET,
        "quality_fleet": {"preset": QUALITY.preset, "speedup": QUALITY.speedup},
        "load_points": [p.__dict__ for p in (*OVERHEAD_POINTS, *QUALITY_POINTS)],
        "scale": scale,
        "rounds": rounds,
        "skipped": skipped,
        "wall_s": time.perf_counter() - started_s,
        "rows": rows,
        "acceptance": acceptance(rows),
        "switchback": switchback,
        "logs": str(logs),
    }


def _cpus() -> int:
    return os.cpu_count() or 0


def peers_command(  # noqa: PLR0917 (one parameter per CLI option)
    out: Annotated[Path, typer.Option(help="JSON results")] = Path("bench-results/peers.json"),
    sglang_python: Annotated[
        Path | None, typer.Option(help="python of a venv with sglang-router")
    ] = None,
    vllm_router: Annotated[Path | None, typer.Option(help="the vllm-router binary")] = None,
    scale: Annotated[float, typer.Option(help="shrink request counts (<1)")] = 1.0,
    routers: Annotated[str, typer.Option(help="comma-separated labels to keep")] = "",
    parts: Annotated[
        str, typer.Option(help="overhead, switchback and/or quality")
    ] = "overhead,switchback,quality",
    rounds: Annotated[int, typer.Option(help="runs of each part (medians kept)")] = ROUNDS,
    wide: WideOpt = False,
) -> None:
    """warmfleet beside sglang-router and vllm-router, same fleet, one run."""
    chosen = parts.split(",")
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown:
        listed = f"{', '.join(unknown)}: not one of {', '.join(PARTS)}"
        typer.echo(f"error: --parts: {listed}", err=True)  # one line, never wrapped
        raise typer.Exit(2)
    kept: tuple[RouterSpec, ...] = ROUTERS
    if routers:
        keep = set(routers.split(","))
        references = ("direct", *REFERENCE_PROXIES)
        kept = tuple(r for r in ROUTERS if r.label in keep or r.router in references)
    paths = PeerPaths(sglang_python, vllm_router)
    with terminate_on_sigterm():
        main_run = run_peers(
            out,
            paths,
            routers=kept,
            scale=scale,
            parts=chosen,
            rounds=max(1, rounds),
        )
        document = run_async(main_run)
    _summary(document, out, wide=wide)


def _summary(document: dict[str, Any], out: Path, *, wide: bool) -> None:
    """The run's tables, its noisy rows and what was skipped, on the terminal."""
    term = output_console()
    grids = [rows_table(document["rows"]), acceptance_table(document["acceptance"])]
    if document["switchback"] is not None:
        switch = document["switchback"]
        grids += [switch_table(switch["rows"]), switch_acceptance_table(switch["acceptance"])]
    emit(grids, wide=wide)
    rows = [*document["rows"], *(document["switchback"] or {}).get("rows", [])]
    noisy = sum(1 for row in rows if row["noisy"])
    if noisy:
        term.print(
            f"[red]{noisy} of {len(rows)} rows are noisy: unrelated processes used "
            "> 15 % of the machine's CPU during them; re-run on an idle machine.[/red]"
        )
    if document["skipped"]:
        term.print(f"[yellow]skipped (not installed): {', '.join(document['skipped'])}[/yellow]")
    term.print(f"wrote {out} in {document['wall_s']:.0f} s (logs: {document['logs']})")


def main() -> None:
    typer.run(peers_command)


if __name__ == "__main__":
    main()
