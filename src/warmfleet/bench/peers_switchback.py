"""The switchback part of `make bench-peers`: every router compared under the same machine.

The overhead part runs one router at a time, direct before and after it. On a shared 2-core
machine the speed of the same work swings by tens of percent from one second to the next
(docs/benchmarks.md, "Switchback"), so a router's "added" latency there is mostly the luck of
its few seconds. Here every router runs at once in front of one fast fleet, and the closed
loop's target rotates: each cycle gives every router (direct too) one slice of ``slice_s``, in
an order shuffled per cycle; a slice ends at a barrier (its requests finish before the next
slice starts) and its first generation (the first ``concurrency`` requests, which start
together) is not kept. A router's added p50 is the median over cycles of its slice's p50 minus
direct's in the same cycle; its CPU a request is its processes' CPU during its own slices over
the requests it was sent. Both come with bootstrap 95 % intervals over cycles
(``peers_switchback_report``).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from warmfleet.bench.cpu_probe import CpuProbe
from warmfleet.bench.live_fleet import FleetHandle, start_fleet
from warmfleet.bench.live_procs import Child, ProcessSet, tree_cpu_s
from warmfleet.bench.loadgen import (
    LoadSpec,
    PreparedRequest,
    RequestResult,
    make_session,
    prepare_requests,
    send_one,
)
from warmfleet.bench.peers_report import NOISY_FRAC
from warmfleet.bench.peers_routers import (
    PROTOCOL_PASSTHROUGH,
    SYNCED_PREFIX_AFFINITY,
    PeerPaths,
    RouterSpec,
    start_router,
)
from warmfleet.bench.peers_switchback_report import (
    DIRECT,
    SliceResult,
    switch_acceptance,
    switch_row,
)
from warmfleet.bench.progress import Activity
from warmfleet.sim.workloads.base import WorkloadRequest


@dataclass(frozen=True)
class SwitchPoint:
    name: str
    concurrency: int
    stream: bool
    cycles: int
    slice_s: float


SWITCH_POINTS = (
    SwitchPoint("c1_8k", 1, False, 16, 1.0),
    SwitchPoint("c32_8k", 32, False, 20, 1.0),
    SwitchPoint("stream_c32_8k", 32, True, 20, 1.0),
)
# issue 22's lines compare prefix_affinity + sync with vllm-router round_robin; the others are
# the steps between a bare relay and ours
SWITCH_ROUTERS = (
    RouterSpec(DIRECT, "client_round_robin"),
    RouterSpec(PROTOCOL_PASSTHROUGH, "round_robin"),
    RouterSpec("warmfleet", "random"),
    RouterSpec("warmfleet", "prefix_affinity"),
    RouterSpec("warmfleet", SYNCED_PREFIX_AFFINITY),
    RouterSpec("vllm-router", "round_robin"),
)
WARMUP_S = 1.0  # one unrecorded slice per router before a point's cycles
REQUEST_TIMEOUT_S = 60.0


@dataclass
class Target:
    spec: RouterSpec
    urls: tuple[str, ...]  # the router's, or the fleet's (direct: the client round-robins)
    pids: tuple[int, ...]
    session: aiohttp.ClientSession


def cycle_orders(labels: Sequence[str], cycles: int, rng: random.Random) -> list[list[str]]:
    """One shuffled order of ``labels`` per cycle."""
    orders = []
    for _ in range(cycles):
        order = list(labels)
        rng.shuffle(order)
        orders.append(order)
    return orders


async def run_slice(
    target: Target, cursor: Iterator[PreparedRequest], spec: LoadSpec, cycle: int, slice_s: float
) -> SliceResult:
    """A closed loop of ``spec.concurrency`` workers against ``target`` for ``slice_s``; it
    returns once every request it started has ended (the barrier)."""
    concurrency = spec.concurrency or 1
    field = "ttft_s" if spec.stream else "e2e_s"
    deadline = time.perf_counter() + slice_s
    done: list[tuple[int, RequestResult]] = []
    started = 0

    async def worker() -> None:
        nonlocal started
        while time.perf_counter() < deadline:
            prepared = next(cursor)
            order, started = started, started + 1
            result = RequestResult(prepared.request.request_id, 0.0)
            url = target.urls[order % len(target.urls)]
            await send_one(target.session, url, prepared, spec, result)
            done.append((order, result))

    cpu_before = sum(tree_cpu_s(pid) for pid in target.pids)
    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(worker())
    cpu_s = sum(tree_cpu_s(pid) for pid in target.pids) - cpu_before if target.pids else None
    kept = [
        1000.0 * float(getattr(r, field) or 0.0)
        for order, r in done
        if order >= concurrency and r.ok
    ]  # fmt: skip
    errors = sum(1 for _order, r in done if not r.ok)
    return SliceResult(cycle, tuple(kept), len(done), errors, cpu_s)


async def run_point(
    targets: Sequence[Target],
    point: SwitchPoint,
    requests: Sequence[WorkloadRequest],
    model: str,
    *,
    rng: random.Random,
    activity: Activity,
    fleet_pid: int,
) -> list[dict[str, Any]]:
    """Warm every target up, then ``point.cycles`` cycles; one row per target."""
    spec = LoadSpec(
        urls=("unused",), model=model, stream=point.stream, concurrency=point.concurrency,
        request_timeout_s=REQUEST_TIMEOUT_S, ignore_eos=True, max_output_tokens=16,
    )  # fmt: skip
    cursor = itertools.cycle(prepare_requests(requests, spec))  # the same mix for every router
    by_label = {t.spec.label: t for t in targets}
    for target in targets:
        await run_slice(target, cursor, spec, -1, WARMUP_S)
    slices: dict[str, list[SliceResult]] = {label: [] for label in by_label}
    machine = CpuProbe((), fleet_pid)  # for the CPU used outside this process tree
    machine.start()
    for cycle, order in enumerate(cycle_orders(list(by_label), point.cycles, rng)):
        for label in order:
            result = await run_slice(by_label[label], cursor, spec, cycle, point.slice_s)
            slices[label].append(result)
        if (cycle + 1) % 5 == 0 or cycle + 1 == point.cycles:
            activity.log(f"switchback {point.name}: cycle {cycle + 1} of {point.cycles}")
    machine.stop()
    direct = slices.get(DIRECT, [])
    shape = {"name": point.name, "concurrency": point.concurrency, "stream": point.stream}
    foreign = machine.foreign_frac
    noisy = {"foreign_cpu_frac": foreign, "noisy": foreign is not None and foreign > NOISY_FRAC}
    return [
        {**switch_row((t.spec.router, t.spec.policy), shape, slices[t.spec.label], direct, rng),
         **noisy}
        for t in targets
    ]  # fmt: skip


async def _start_targets(
    procs: ProcessSet,
    paths: PeerPaths,
    routers: Sequence[RouterSpec],
    fleet: FleetHandle,
    started: list[Child],
) -> list[Target]:
    """Start every router (appending its processes to ``started`` as they come up)."""
    out = []
    for spec in routers:
        router = await start_router(procs, spec, paths, fleet)
        started += router.children
        urls = (router.url,) if router.url else fleet.urls
        pids = tuple(child.pid for child in router.children)
        out.append(Target(spec, urls, pids, make_session(LoadSpec(urls=urls, concurrency=64))))
    return out


async def run_switchback(
    procs: ProcessSet,
    paths: PeerPaths,
    routers: Sequence[RouterSpec],
    fleet_spec: dict[str, Any],
    requests: Sequence[WorkloadRequest],
    *,
    instances: int,
    points: Sequence[SwitchPoint] = SWITCH_POINTS,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Every router in ``routers`` (direct among them) at once, each point's cycles; rows.
    Stops what it started (by PID) on every exit path."""
    rng = random.Random(seed)
    started: list[Child] = []
    targets: list[Target] = []
    rows: list[dict[str, Any]] = []
    try:
        fleet = await start_fleet(
            procs, name="fleet-switchback", instances=instances, spec=fleet_spec
        )
        started.append(fleet.child)
        targets = await _start_targets(procs, paths, routers, fleet, started)
        with Activity() as activity:
            for point in points:
                rows += await run_point(
                    targets, point, requests, fleet.model,
                    rng=rng, activity=activity, fleet_pid=fleet.child.pid,
                )  # fmt: skip
    finally:
        for target in targets:
            await target.session.close()
        for child in reversed(started):
            procs.stop(child)
    return rows


async def switchback_part(
    procs: ProcessSet,
    paths: PeerPaths,
    wanted: Sequence[RouterSpec],
    requests: Sequence[WorkloadRequest],
    *,
    fleet_spec: dict[str, Any],
    instances: int,
    scale: float = 1.0,
) -> dict[str, Any]:
    """The part's section of `make bench-peers`' document: the ``SWITCH_ROUTERS`` among
    ``wanted``, each point's cycles shrunk by ``scale`` (< 1, at least 2)."""
    routers = [r for r in SWITCH_ROUTERS if r in wanted]
    points = [
        replace(p, cycles=max(2, int(p.cycles * scale))) if scale < 1.0 else p
        for p in SWITCH_POINTS
    ]  # fmt: skip
    rows = await run_switchback(
        procs, paths, routers, fleet_spec, requests, instances=instances, points=points
    )
    return {
        "points": [p.__dict__ for p in points],
        "routers": [r.label for r in routers],
        "rows": rows,
        "acceptance": switch_acceptance(rows),
    }
