"""The embedded fleet's replica bookkeeping, without the rest of the fleet running."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp import web

from support.servers import serving
from warmfleet.control.reconciler import plan
from warmfleet.local.backoff import CrashBackoff
from warmfleet.local.config import parse_fleet
from warmfleet.local.fleet import EmbeddedFleet
from warmfleet.local.procs import start_child
from warmfleet.local.replicas import Replica
from warmfleet.local.state import trim_history


def _endpoint(name: str) -> dict[str, object]:
    return {
        "name": name,
        "spec": {
            "modelSource": {"uri": "origin://demo", "revision": "v1"},
            "image": "x",
            "variants": [{"name": "main"}],
        },
    }


def _fleet(
    tmp_path: Path, start_timeout_s: float = 120.0, endpoints: tuple[str, ...] = ()
) -> EmbeddedFleet:
    doc = {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "LocalFleet",
        "spec": {
            "workdir": str(tmp_path),
            "nodes": [{"name": "a", "budget": "1GiB"}],
            "origin": {"models": [{"name": "demo", "size": "10MB", "revisions": ["v1"]}]},
            "engine": {"startTimeoutS": start_timeout_s},
            "endpoints": [_endpoint(name) for name in endpoints],
        },
    }
    return EmbeddedFleet(parse_fleet(doc))


async def test_a_replica_that_never_gets_ready_is_replaced_after_the_start_timeout(
    tmp_path: Path,
) -> None:
    fleet = _fleet(tmp_path, start_timeout_s=0.2)
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]  # never writes its ready file
    child = await start_child("stuck", argv, tmp_path / "stuck.json", tmp_path / "logs")
    try:
        stuck = Replica("stuck", "d", "demo", "main", "a", False, "origin", child)
        fleet.replicas[stuck.name] = stuck
        fleet.history[stuck.name] = stuck.summary()
        fleet._observe_replicas()
        assert stuck.draining_since_s is None  # still within its start timeout
        child.started_wall_s -= 1.0
        fleet._observe_replicas()
        assert stuck.draining_since_s is not None  # out of the Deployment's pods: replaced
        assert fleet.history["stuck"]["state"] == "startTimedOut"
        assert [e["kind"] for e in fleet.events] == ["replica_draining", "replica_start_timeout"]
        await fleet._reap()  # not ready: stopped at once
        assert "stuck" not in fleet.replicas
        await fleet._stopping["stuck"]
        assert not child.alive
    finally:
        await child.stop(grace_s=1.0)


def test_an_endpoint_removed_from_the_fleet_file_is_deleted_and_released(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, endpoints=("a", "b"))
    for entry in fleet.spec.endpoints:
        fleet.put_endpoint(entry.name, entry.spec)
    world = fleet.world
    for step in range(4):
        world.apply(plan(world.desired(), world.observed(float(step))), float(step))
    assert len(world.deployments) == 2
    edited = _fleet(tmp_path, endpoints=("a",))
    fleet.apply_endpoints(edited.spec.endpoints)
    assert world.endpoints["b"].deleting
    assert not world.endpoints["a"].deleting
    for step in range(4, 8):
        world.apply(plan(world.desired(), world.observed(float(step))), float(step))
    assert world.released == ["b"]
    assert [d.endpoint for d in world.deployments.values()] == ["a"]


def test_crash_backoff_replaces_the_first_exit_at_once_then_doubles() -> None:
    backoff = CrashBackoff(initial_s=10.0, max_s=300.0)
    assert backoff.exited("d", 100.0) == 0.0  # one crash: replaced at once
    assert backoff.wait_s("d", 100.0) == 0.0
    assert [backoff.exited("d", 100.0) for _ in range(7)] == [10, 20, 40, 80, 160, 300, 300]
    assert backoff.wait_s("d", 250.0) == 150.0
    assert backoff.wait_s("other", 100.0) == 0.0  # per Deployment
    backoff.ready("d")  # a ready replica forgives the exits
    assert (backoff.exits("d"), backoff.wait_s("d", 100.0)) == (0, 0.0)
    backoff.exited("d", 0.0)
    backoff.exited("d", 0.0)
    backoff.retain(["other"])  # a deleted Deployment is forgotten
    assert (backoff.exits("d"), backoff.wait_s("d", 0.0)) == (0, 0.0)


async def test_a_replica_that_keeps_exiting_is_restarted_with_a_growing_wait(
    tmp_path: Path,
) -> None:
    """Each replica of the Deployment exits before it is ready: the first is replaced at the
    next pass, the second only after engine.crashBackoffS (not at every pass)."""
    fleet = _fleet(tmp_path, endpoints=("a",))
    fleet.put_endpoint("a", fleet.spec.endpoints[0].spec)
    world = fleet.world
    for step in range(4):
        world.apply(plan(world.desired(), world.observed(float(step))), float(step))
    (ours,) = world.deployments
    placed: list[int] = []

    async def place(deployment: str, count: int) -> None:
        assert deployment == ours
        placed.append(count)

    fleet._place = place  # type: ignore[method-assign]
    argv = [sys.executable, "-c", "raise SystemExit(3)"]
    for attempt in range(2):
        child = await start_child(f"c{attempt}", argv, tmp_path / f"c{attempt}.json", tmp_path)
        await asyncio.wait_for(child.proc.wait(), 30.0)
        replica = Replica(f"c{attempt}", ours, "a", "main", "a", False, "origin", child)
        fleet.replicas[replica.name] = replica
        fleet.history[replica.name] = replica.summary()
        fleet._observe_replicas()
        await fleet._sync_replicas()
    exited = [e for e in fleet.events if e["kind"] == "replica_exited"]
    assert [(e["rc"], e["backoff_s"]) for e in exited] == [(3, 0.0), (3, 10.0)]
    assert len(placed) == 1  # replaced after the first exit only: the second waits 10 s
    fleet.backoff._not_before_s[ours] = time.time() - 1.0  # the wait is over
    await fleet._sync_replicas()
    assert len(placed) == 2


async def test_a_failed_gateway_scrape_is_no_autoscaling_sample(tmp_path: Path) -> None:
    """A 503, an unparsable body or a refused connection leaves no metrics for the autoscaler
    (it holds its counts instead of re-reading the last good sample) and raises nothing; drains
    keep the last known in-flight counts."""
    answers = [
        (200, 'warmfleet_gateway_in_flight_requests{instance_id="r1",variant="main"} 3\n'),
        (503, "unavailable"),
        (200, "this is { not the exposition format"),
    ]

    async def metrics(_: web.Request) -> web.Response:
        status, body = answers.pop(0)
        return web.Response(status=status, text=body)

    fleet = _fleet(tmp_path)
    async with serving({"/metrics": metrics}) as (url, runner), aiohttp.ClientSession() as http:
        fleet.gateway = SimpleNamespace(url=url)  # type: ignore[assignment]
        fleet._session = http
        await fleet._observe_gateway()
        assert fleet._metrics_text is not None
        assert fleet.in_flight == {"r1": 3.0}
        for _ in range(2):  # the 503, then the garbage
            await fleet._observe_gateway()
            assert fleet._metrics_text is None
            assert fleet.in_flight == {"r1": 3.0}
        await runner.cleanup()
        await fleet._observe_gateway()  # connection refused
        assert fleet._metrics_text is None


def test_the_history_keeps_live_replicas_and_drops_the_oldest_gone_ones() -> None:
    history: dict[str, Any] = {f"r{i}": {"state": "stopped"} for i in range(6)}
    trim_history(history, live={"r0", "r4"}, limit=4)
    assert list(history) == ["r0", "r3", "r4", "r5"]
    trim_history(history, live={"r0", "r3", "r4", "r5"}, limit=2)  # all live: all kept
    assert list(history) == ["r0", "r3", "r4", "r5"]
