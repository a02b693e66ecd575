"""Scale from zero on the embedded fleet: time to first token of requests that arrive while a
variant has no ready replica, from a cold node, a warm node and a sleeping warm standby.

Each case is a fresh fleet (2 nodes, origin throttled) with one endpoint whose variant has
``autoscaling.minReplicas: 0``: a probe request (held) brings up its first replica, it goes idle
and is scaled to zero after ``scaleToZeroAfterS``; then ``requests`` streamed chat completions
are sent at once. The gateway holds them (no ready replica), the held-requests gauge brings the
variant back to one replica, and they are served. Cases:

- ``cold_node``: no weights cache: the new replica reads its weights from the origin;
- ``warm_node``: weights cache on every node: the new replica reads them from its node's cache;
- ``standby``: weights cache and ``standby.engine: asleep``: at zero the last replica was put to
  sleep (level 1), and the first request after idle pays only its wake.

``first_token_s.<case>`` is the median over the held requests of request sent -> first SSE
event; ``failed_requests`` counts every held request not answered 200 with a complete stream.
``python -m harness.scale_from_zero --out bench-results/fleet.json`` runs it alone (merging
under ``scale_from_zero``); ``harness.fleet_acceptance`` calls ``run_scale_from_zero``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import typer

from harness.results import (
    DEFAULT_OUT,
    MaxSOpt,
    OutOpt,
    SizeOpt,
    ThrottleOpt,
    merge_into,
)
from warmfleet.local.config import LocalFleet, parse_fleet
from warmfleet.local.fleet import EmbeddedFleet

MODEL = "sfz"
CASES = ("cold_node", "warm_node", "standby")
IDLE_S = 2.0  # scaleToZeroAfterS


class ScaleFromZeroError(RuntimeError):
    """A condition of the run was not reached in time."""


def _variant(case: str) -> dict[str, Any]:
    variant: dict[str, Any] = {
        "name": "main",
        "replicas": 1,
        "autoscaling": {
            "enabled": True,
            "minReplicas": 0,
            "maxReplicas": 2,
            "targetInFlightPerReplica": 8,
            "scaleToZeroAfterS": IDLE_S,
            "scaleDownStabilizationS": 0,
            "scaleDownCooldownS": 0,
        },
    }
    if case == "standby":
        variant["standby"] = {"engine": "asleep", "sleepLevel": 1}
    return variant


def fleet_config(workdir: Path, case: str, size_bytes: int, throttle_bps: int) -> LocalFleet:
    cached = case != "cold_node"
    spec = {
        "modelSource": {"uri": f"origin://{MODEL}", "revision": "v1"},
        "image": "warmfleet/emulator:local",
        "modelCacheConfig": {"weightsCache": {"enabled": cached, "hostPath": "/warmfleet/c"}},
        "variants": [_variant(case)],
    }
    nodes = [{"name": f"node-{c}", "budget": 2 * size_bytes + (64 << 20)} for c in "ab"]
    return parse_fleet(
        {
            "apiVersion": "warmfleet.dev/v1alpha1",
            "kind": "LocalFleet",
            "spec": {
                "workdir": str(workdir),
                "nodes": nodes,
                "origin": {
                    "throttle": throttle_bps,
                    "models": [{"name": MODEL, "size": size_bytes, "revisions": ["v1"]}],
                },
                "engine": {"speedup": 50, "replicasPerNode": 2},
                "gateway": {"port": 0, "pollIntervalS": 0.1, "holdTimeoutS": 60},
                "reconcileIntervalS": 0.25,
                "drainGraceS": 0.5,
                "endpoints": [{"name": MODEL, "spec": spec}],
            },
        },
        f"scale-from-zero {case}",
    )


async def _wait(what: str, cond: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise ScaleFromZeroError(f"timed out after {timeout_s} s waiting for: {what}")
        await asyncio.sleep(0.05)


async def first_token(session: aiohttp.ClientSession, url: str, n: int) -> tuple[float, bool]:
    """One streamed chat completion: seconds to its first SSE event, and whether it succeeded
    (200 and a stream that ends with ``[DONE]``)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"after idle {n}"}],
        "max_tokens": 8,
        "stream": True,
    }
    started = time.perf_counter()
    ttft_s = float("nan")
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            await resp.read()
            return time.perf_counter() - started, False
        done = False
        async for line in resp.content:
            if line.startswith(b"data: ") and ttft_s != ttft_s:
                ttft_s = time.perf_counter() - started
            done = done or line.strip() == b"data: [DONE]"
    return ttft_s, done


def _serving(fleet: EmbeddedFleet) -> list[Any]:
    return [r for r in fleet.replicas.values() if r.standby is None and r.ready]


def _at_zero(fleet: EmbeddedFleet, case: str) -> bool:
    deps = list(fleet.world.deployments.values())
    if not deps or any(d.replicas for d in deps) or _serving(fleet):
        return False
    asleep = [r for r in fleet.replicas.values() if r.standby == "asleep"]
    return bool(asleep) if case == "standby" else not fleet.replicas


async def run_case(
    workdir: Path, case: str, size_bytes: int, throttle_bps: int, requests: int
) -> dict[str, Any]:
    config = fleet_config(workdir, case, size_bytes, throttle_bps)
    stop = asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=120.0)
    async with (
        EmbeddedFleet(config) as fleet,
        asyncio.TaskGroup() as tg,
        aiohttp.ClientSession(timeout=timeout) as session,
    ):
        runner = tg.create_task(fleet.run(stop))
        try:
            assert fleet.gateway is not None
            url = fleet.gateway.url
            # An idle variant goes to zero even before its first replica is ready: the probe
            # is held until one serves it (a first scale from zero, not measured).
            _, probe_ok = await first_token(session, url, 0)
            await _wait("scaled to zero", lambda: _at_zero(fleet, case), 60.0)
            await asyncio.sleep(0.5)
            results = await asyncio.gather(
                *(first_token(session, url, i + 1) for i in range(requests))
            )
            served_by = [r.summary() for r in _serving(fleet)]
        finally:
            stop.set()
        await runner
    ttfts = [t for t, ok in results if ok]
    events = [e["kind"] for e in fleet.events]
    return {
        "first_token_s": round(statistics.median(ttfts), 3) if ttfts else None,
        "first_token_s_all": [round(t, 3) for t, _ in results],
        "failed_requests": sum(1 for _, ok in results if not ok) + (0 if probe_ok else 1),
        "replicas_after": [
            {k: s[k] for k in ("node", "prepared", "loadSource", "timeToReadyS")} for s in served_by
        ],
        "standby_woken": "standby_woken" in events,
    }


async def run_scale_from_zero(
    workdir: Path, size_bytes: int, throttle_bps: int, requests: int = 3
) -> dict[str, Any]:
    """The ``scale_from_zero`` figures of ``fleet.json``."""
    cases = {}
    for case in CASES:
        case_dir = workdir / case
        case_dir.mkdir(parents=True, exist_ok=True)
        cases[case] = await run_case(case_dir, case, size_bytes, throttle_bps, requests)
    first = {c: cases[c]["first_token_s"] for c in CASES}
    measured = all(v is not None for v in first.values())
    return {
        "first_token_s": first,
        "ordered_standby_warm_cold": measured
        and first["standby"] < first["warm_node"] < first["cold_node"],
        "failed_requests": sum(c["failed_requests"] for c in cases.values()),
        "held_requests_per_case": requests,
        "cases": cases,
        "params": {
            "model_bytes": size_bytes,
            "origin_throttle_bps": throttle_bps,
            "nodes": 2,
            "scale_to_zero_after_s": IDLE_S,
            "engine": "warmfleet emulate (tiny-cpu, speedup 50), standby sleep level 1",
        },
    }


def command(
    out: OutOpt = DEFAULT_OUT,
    size: SizeOpt = 200_000_000,
    throttle: ThrottleOpt = 100_000_000,
    max_s: MaxSOpt = 400.0,
) -> None:
    """Scale from zero alone; prints its summary line."""

    async def bounded(workdir: Path) -> dict[str, Any]:
        async with asyncio.timeout(max_s):
            return await run_scale_from_zero(workdir, size, throttle)

    with tempfile.TemporaryDirectory(prefix="warmfleet-sfz-", dir="/var/tmp") as tmp:
        figures = asyncio.run(bounded(Path(tmp)))
    merge_into(out, {"scale_from_zero": figures})
    summary = {k: figures[k] for k in ("first_token_s", "failed_requests")}
    print(json.dumps(summary))


def main() -> None:
    typer.run(command)


if __name__ == "__main__":
    main()
