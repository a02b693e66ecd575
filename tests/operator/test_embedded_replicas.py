"""The embedded fleet's replica bookkeeping, without the rest of the fleet running."""

from __future__ import annotations

import sys
from pathlib import Path

from warmfleet.control.reconciler import plan
from warmfleet.operator.embedded.config import parse_fleet
from warmfleet.operator.embedded.fleet import EmbeddedFleet
from warmfleet.operator.embedded.procs import start_child
from warmfleet.operator.embedded.replicas import Replica


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
