"""Acceptance 1 and 2 on the embedded backend, under a steady load through the gateway.

1. Rollover: a model-source change (v1 -> v2) builds the new cache, starts new replicas on warm
   nodes, switches the gateway, drains and stops the old replicas and deletes the old cache; no
   request may fail. The first revision is deployed with the weights gate open (``mode: none``)
   so its replicas start cold (weights from the origin) and the second with ``mode: all`` so
   they start warm (weights from the node cache): both start times are measured.
2. Node loss: a node agent is killed (SIGKILL) and, later, a node's cache directory is deleted.
   Each time the node loses its ready label, a replica added meanwhile lands on a warm node, the
   node is refilled (agent restarted / data re-downloaded) and gets its label back; no request
   may fail.

``python -m harness.fleet_acceptance --out bench-results/fleet.json`` (with ``tests`` on
``PYTHONPATH``; the second step of ``make bench-fleet``) merges the figures into the file as
top-level fields (the what-if stays under its own key). ``tests/operator/test_embedded_fleet.py``
runs a smaller one. An acceptance harness, not part of the installed package.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from harness.results import (
    DEFAULT_OUT,
    MaxSOpt,
    OutOpt,
    SizeOpt,
    ThrottleOpt,
    merge_into,
)
from harness.scale_from_zero import run_scale_from_zero
from harness.steady_load import SteadyLoad
from warmfleet.api.names import weights_label
from warmfleet.api.resources import EndpointPhase, InferenceEndpointSpec
from warmfleet.core.errors import WarmfleetError
from warmfleet.local.config import LocalFleet, parse_fleet
from warmfleet.local.fleet import EmbeddedFleet
from warmfleet.local.state import start_times

ENDPOINT = "demo"


class AcceptanceError(WarmfleetError):
    """A condition of the acceptance run was not reached in time."""


def fleet_config(workdir: Path, size_bytes: int, throttle_bps: int, replicas: int) -> LocalFleet:
    nodes = [{"name": f"node-{c}", "budget": 3 * size_bytes + (64 << 20)} for c in "abc"]
    return parse_fleet(
        {
            "apiVersion": "warmfleet.dev/v1alpha1",
            "kind": "LocalFleet",
            "spec": {
                "workdir": str(workdir),
                "nodes": nodes,
                "origin": {
                    "throttle": throttle_bps,
                    "models": [
                        {"name": ENDPOINT, "size": size_bytes, "revisions": ["v1", "v2", "v3"]}
                    ],
                },
                "engine": {"speedup": 50, "replicasPerNode": 2},
                "gateway": {"port": 0, "pollIntervalS": 0.2},
                "reconcileIntervalS": 0.25,
                "agentRestartDelayS": 1.0,
                "drainGraceS": 1.0,
                "endpoints": [{"name": ENDPOINT, "spec": endpoint_spec("v1", "none", replicas)}],
            },
        },
        "acceptance",
    )


def endpoint_spec(
    revision: str, gate: str, replicas: int, rollout: dict[str, Any] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "modelSource": {"uri": f"origin://{ENDPOINT}", "revision": revision},
        "image": "warmfleet/emulator:local",
        "modelCacheConfig": {
            "weightsCache": {
                "enabled": True,
                "hostPath": "/warmfleet/cache",
                "gate": {"mode": gate},
            }
        },
        "variants": [{"name": "main", "replicas": replicas}],
    }
    if rollout is not None:
        spec["rollout"] = rollout
    return spec


def _spec(
    revision: str, gate: str, replicas: int, rollout: dict[str, Any] | None = None
) -> InferenceEndpointSpec:
    return InferenceEndpointSpec.model_validate(endpoint_spec(revision, gate, replicas, rollout))


async def wait_for(what: str, cond: Callable[[], bool], timeout_s: float) -> float:
    started = time.monotonic()
    while not cond():
        if time.monotonic() - started > timeout_s:
            raise AcceptanceError(f"timed out after {timeout_s} s waiting for: {what}")
        await asyncio.sleep(0.1)
    return time.monotonic() - started


def _serving(fleet: EmbeddedFleet, revision_of: str, replicas: int) -> bool:
    """Endpoint Ready at the current revision, only that revision's replicas left."""
    endpoint = fleet.world.endpoints[ENDPOINT]
    status = endpoint.status
    deployments = list(fleet.world.deployments.values())
    return (
        status is not None
        and status.phase == EndpointPhase.READY
        and status.revision == revision_of
        and len(deployments) == 1
        and deployments[0].ready_replicas == replicas
        and all(r.deployment == deployments[0].name for r in fleet.replicas.values())
    )


def _has_label(fleet: EmbeddedFleet, node: str, cache: str) -> bool:
    return fleet.world.nodes[node].labels.get(weights_label(cache)) == "ready"


def _current_cache(fleet: EmbeddedFleet) -> str:
    return next(iter(fleet.world.deployments.values())).model_cache or ""


async def rollover(fleet: EmbeddedFleet, load: SteadyLoad, replicas: int) -> dict[str, Any]:
    old_cache = _current_cache(fleet)
    old_dirs = [p for (n, c), p in fleet.cache_paths.items() if c == old_cache]
    load.phase = "rollover"
    fleet.put_endpoint(ENDPOINT, _spec("v2", "all", replicas))
    new_revision = ""

    def done() -> bool:
        nonlocal new_revision
        status = fleet.world.endpoints[ENDPOINT].status
        new_revision = status.revision if status else ""
        return (
            _current_cache(fleet) != old_cache
            and _serving(fleet, new_revision, replicas)
            and old_cache not in fleet.world.model_caches
        )

    took = await wait_for("rollover to v2 and the old cache deleted", done, 240.0)
    return {
        "rollover_s": round(took, 2),
        "old_cache": old_cache,
        "old_cache_deleted": old_cache not in fleet.world.model_caches,
        "old_cache_data_gone": all(not Path(p).exists() for p in old_dirs),
        "new_cache": _current_cache(fleet),
    }


async def rolling_rollover(
    fleet: EmbeddedFleet, load: SteadyLoad, replicas: int, revision: str
) -> dict[str, Any]:
    """Roll to ``revision`` with a Rolling rollout that needs no spare replica (maxSurge 0;
    with one replica that would leave none serving, so then maxSurge 1, maxUnavailable 0)."""
    rollout: dict[str, Any] = {"type": "Rolling", "maxSurge": 0, "maxUnavailable": 1}
    if replicas == 1:
        rollout = {"type": "Rolling", "maxSurge": 1, "maxUnavailable": 0}
    old_cache = _current_cache(fleet)
    load.phase = "rolling_rollover"
    fleet.put_endpoint(ENDPOINT, _spec(revision, "all", replicas, rollout))
    peak = {"declared": 0, "not_draining": 0}

    def done() -> bool:
        declared = sum(d.replicas for d in fleet.world.deployments.values())
        live = sum(1 for r in fleet.replicas.values() if r.draining_since_s is None)
        peak["declared"] = max(peak["declared"], declared)
        peak["not_draining"] = max(peak["not_draining"], live)
        return _serving(fleet, _revision(fleet), replicas) and _current_cache(fleet) != old_cache

    took = await wait_for(f"rolling rollover to {revision}", done, 240.0)
    return {
        "rollout": rollout,
        "rolling_rollover_s": round(took, 2),
        "max_declared_replicas": peak["declared"],
        "max_replicas_not_draining": peak["not_draining"],
        "new_cache": _current_cache(fleet),
    }


def kill_agent(fleet: EmbeddedFleet, node: str) -> int:
    """Fault: SIGKILL ``node``'s agent (the fleet restarts it)."""
    child = fleet.agents[node]
    with contextlib.suppress(ProcessLookupError):  # dies without cleaning up
        os.kill(child.pid, signal.SIGKILL)
    fleet.event("fault_kill_agent", node=node, pid=child.pid)
    return child.pid


def delete_node_cache(fleet: EmbeddedFleet, node: str, cache: str) -> str | None:
    """Fault: delete ``cache``'s published directory on ``node``."""
    path = fleet.cache_paths.get((node, cache))
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
        fleet.event("fault_delete_cache", node=node, cache=cache, path=path)
    return path


async def node_loss(
    fleet: EmbeddedFleet, load: SteadyLoad, node: str, kind: str, replicas: int
) -> dict[str, Any]:
    """Kill ``node``'s agent or delete its cache; check the label, placement and refill."""
    cache = _current_cache(fleet)
    load.phase = "node_loss"
    started = time.monotonic()
    if kind == "kill_agent":
        kill_agent(fleet, node)
    else:
        delete_node_cache(fleet, node, cache)
    lost_s = await wait_for(
        f"{node} loses its ready label", lambda: not _has_label(fleet, node, cache), 60.0
    )
    before = set(fleet.replicas)
    fleet.put_endpoint(ENDPOINT, _spec("v2", "all", replicas + 1))  # scale out while it is lost
    await wait_for("the added replica", lambda: len(set(fleet.replicas) - before) == 1, 30.0)
    added = fleet.replicas[next(iter(set(fleet.replicas) - before))]
    placed_on_lost_node = added.node == node
    labelled_during_placement = _has_label(fleet, node, cache)
    await wait_for(f"{node} refilled and labelled", lambda: _has_label(fleet, node, cache), 120.0)
    refilled_s = time.monotonic() - started
    fleet.put_endpoint(ENDPOINT, _spec("v2", "all", replicas))
    await wait_for(
        "back to the replica count", lambda: _serving(fleet, _revision(fleet), replicas), 60.0
    )
    return {
        "kind": kind,
        "node": node,
        "label_lost_after_s": round(lost_s, 2),
        "refilled_after_s": round(refilled_s, 2),
        "scale_out_replica_node": added.node,
        "scale_out_replica_prepared": added.prepared,
        "scale_out_avoided_lost_node": not placed_on_lost_node and not labelled_during_placement,
    }


def _revision(fleet: EmbeddedFleet) -> str:
    status = fleet.world.endpoints[ENDPOINT].status
    return status.revision if status else ""


async def run_acceptance(
    workdir: Path,
    size_bytes: int,
    throttle_bps: int,
    *,
    replicas: int = 2,
    concurrency: int = 4,
    faults: tuple[str, ...] = ("kill_agent", "delete_cache"),
) -> dict[str, Any]:
    config = fleet_config(workdir, size_bytes, throttle_bps, replicas)
    stop = asyncio.Event()
    started = time.monotonic()
    async with EmbeddedFleet(config) as fleet, asyncio.TaskGroup() as tg:
        runner = tg.create_task(fleet.run(stop))
        try:
            out = await _scenario(fleet, replicas, concurrency, faults, tg)
        finally:
            stop.set()
        await runner
    out["wall_s"] = round(time.monotonic() - started, 2)
    return out


async def _scenario(
    fleet: EmbeddedFleet,
    replicas: int,
    concurrency: int,
    faults: tuple[str, ...],
    tg: asyncio.TaskGroup,
) -> dict[str, Any]:
    await wait_for(
        "first revision serving", lambda: _serving(fleet, _revision(fleet), replicas), 240.0
    )
    await wait_for(
        "v1 cache on every node",
        lambda: all(_has_label(fleet, n, _current_cache(fleet)) for n in fleet.world.nodes),
        240.0,
    )
    assert fleet.gateway is not None
    await _until_gateway_serves(fleet.gateway.url, 30.0)
    load = SteadyLoad(fleet.gateway.url, ENDPOINT, concurrency=concurrency)
    load_task = tg.create_task(load.run())
    try:
        await asyncio.sleep(1.0)
        roll = await rollover(fleet, load, replicas)
        losses = [await node_loss(fleet, load, _spare_node(fleet), f, replicas) for f in faults]
        rolling = await rolling_rollover(fleet, load, replicas, "v3")
        load.phase = "after"
        await asyncio.sleep(1.0)
    finally:
        load.stop()
    await load_task
    starts = start_times(list(fleet.history.values()))
    return {
        "rollover_failed_requests": load.failed["rollover"],
        "node_loss_failed_requests": load.failed["node_loss"],
        "rolling_rollover_failed_requests": load.failed["rolling_rollover"],
        "warm_start_s": _round(starts["warmStartS"]),
        "cold_start_s": _round(starts["coldStartS"]),
        "warm_weights_load_s": _round(starts["warmWeightsLoadS"]),
        "cold_weights_load_s": _round(starts["coldWeightsLoadS"]),
        "unprepared_replica_share": round(starts["unpreparedReplicaShare"], 4),
        "replica_starts": {"warm": starts["warmStarts"], "cold": starts["coldStarts"]},
        "weights_bytes_read": sorted(
            {h["weightsBytes"] for h in fleet.history.values() if h.get("weightsBytes")}
        ),
        "requests": {"sent": dict(load.sent), "failed": dict(load.failed), "errors": load.errors},
        "rollover": roll,
        "node_loss": losses,
        "rolling_rollover": rolling,
    }


async def _until_gateway_serves(url: str, timeout_s: float) -> None:
    """The gateway has discovered the replicas (the file poll) before the load starts."""
    probe = SteadyLoad(url, ENDPOINT, concurrency=1, max_requests=1)
    deadline = time.monotonic() + timeout_s
    while True:
        probe.sent.clear()
        probe.failed.clear()
        await probe.run()
        if not probe.failed:
            return
        if time.monotonic() > deadline:
            raise AcceptanceError(f"the gateway did not serve within {timeout_s} s")
        await asyncio.sleep(0.2)


def _spare_node(fleet: EmbeddedFleet) -> str:
    """A node without replicas (so a scale-out would go there if it kept its label)."""
    used = {r.node for r in fleet.replicas.values()}
    free = sorted(n for n in fleet.world.nodes if n not in used)
    return free[0] if free else sorted(fleet.world.nodes)[-1]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


SUMMARY_KEYS = (
    "rollover_failed_requests",
    "node_loss_failed_requests",
    "rolling_rollover_failed_requests",
    "warm_start_s",
    "cold_start_s",
    "unprepared_replica_share",
)


def acceptance_command(
    out: OutOpt = DEFAULT_OUT,
    size: SizeOpt = 200_000_000,
    throttle: ThrottleOpt = 100_000_000,
    max_s: MaxSOpt = 280.0,
) -> None:
    """Acceptance 1 and 2 on the embedded backend; prints the summary line."""

    async def bounded(workdir: Path) -> dict[str, Any]:
        async with asyncio.timeout(max_s):
            return await run_acceptance(workdir, size, throttle)

    async def scale_from_zero(workdir: Path) -> dict[str, Any]:
        async with asyncio.timeout(400.0):
            return await run_scale_from_zero(workdir, size, throttle)

    with tempfile.TemporaryDirectory(prefix="warmfleet-fleet-", dir="/var/tmp") as tmp:
        figures = asyncio.run(bounded(Path(tmp)))
    with tempfile.TemporaryDirectory(prefix="warmfleet-sfz-", dir="/var/tmp") as tmp:
        figures["scale_from_zero"] = asyncio.run(scale_from_zero(Path(tmp)))  # issue 24 item 3
    figures["embedded_params"] = {
        "model_bytes": size,
        "origin_throttle_bps": throttle,
        "nodes": 3,
        "replicas": 2,
        "engine": "warmfleet emulate (tiny-cpu, speedup 50) reading every weights byte",
    }
    merge_into(out, figures)
    print(json.dumps({k: figures[k] for k in SUMMARY_KEYS}))


def main() -> None:
    typer.run(acceptance_command)


if __name__ == "__main__":
    main()
