"""Peer distribution on the embedded fleet: N nodes fill one model version from a throttled
origin, with peers (``spec.peers.enabled``, ``k`` = 1) and without, side by side in one run;
then a fill with faults (a peer SIGKILLed mid-transfer, a peer serving flipped bytes, a peer
that stalls mid-piece).

Measured: time from the endpoint's creation until every node's cache is ready (label), the
origin's egress (its ``/stats``) over the model size, the nodes' peer figures (bytes from
peers / origin, pieces rejected), the tracker's counts, and whether any node published a
corrupt or partial copy (each published file re-hashed against the origin's file).

``python -m harness.p2p_acceptance --out bench-results/fleet.json`` (``tests`` on
``PYTHONPATH``; a step of ``make bench-fleet``) merges ``p2p``, ``no_p2p`` and ``p2p_ready_ratio``
into the file. ``tests/operator/test_p2p_fleet.py`` runs a small one.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import typer

from harness.audit import sha256_of as _sha256
from harness.bad_peers import BadPeer, advertise
from harness.fleet_acceptance import ENDPOINT, _spec, endpoint_spec, wait_for
from harness.results import (
    DEFAULT_OUT,
    MaxSOpt,
    OutOpt,
    SizeOpt,
    ThrottleOpt,
    merge_into,
)
from warmfleet.api.names import weights_label
from warmfleet.local.config import LocalFleet, origin_file, parse_fleet
from warmfleet.local.fleet import EmbeddedFleet

FAULTS = ("kill_peer", "flip_bytes", "stall")


def p2p_config(
    workdir: Path, nodes: int, size_bytes: int, throttle_bps: int, *, peers: bool, piece_bytes: int
) -> LocalFleet:
    names = [f"node-{chr(ord('a') + i)}" for i in range(nodes)]
    return parse_fleet(
        {
            "apiVersion": "warmfleet.dev/v1alpha1",
            "kind": "LocalFleet",
            "spec": {
                "workdir": str(workdir),
                "nodes": [{"name": n, "budget": 2 * size_bytes + (64 << 20)} for n in names],
                "origin": {
                    "throttle": throttle_bps,
                    "models": [{"name": ENDPOINT, "size": size_bytes, "revisions": ["v1"]}],
                },
                "engine": {"speedup": 50, "replicasPerNode": 1},
                "gateway": {"port": 0, "pollIntervalS": 0.2},
                "reconcileIntervalS": 0.2,
                "agentRestartDelayS": 0.5,
                "peers": {"enabled": peers, "originFetches": 1, "pieceBytes": piece_bytes},
                "endpoints": [{"name": ENDPOINT, "spec": _idle()}],
            },
        },
        "p2p-acceptance",
    )


def _idle() -> dict[str, Any]:
    """The endpoint before the measured step: no replica, no weights cache (nothing to fill)."""
    spec = endpoint_spec("v1", "all", 0)
    spec["modelCacheConfig"]["weightsCache"]["enabled"] = False
    return spec


def _cache(fleet: EmbeddedFleet) -> str:
    return next(iter(fleet.world.model_caches), "")


def _all_ready(fleet: EmbeddedFleet) -> bool:
    cache = _cache(fleet)
    label = weights_label(cache)
    return bool(cache) and all(n.labels.get(label) == "ready" for n in fleet.world.nodes.values())


async def _json(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=5.0)) as resp:
        resp.raise_for_status()
        doc = await resp.json()
    return doc if isinstance(doc, dict) else {}


def bad_published(fleet: EmbeddedFleet, want_sha256: str, size_bytes: int) -> int:
    """Nodes whose published copy is not byte-identical to the origin's file."""
    bad = 0
    cache = _cache(fleet)
    for node in fleet.world.nodes:
        path = fleet.cache_paths.get((node, cache))
        files = [] if path is None else [f for f in Path(path).rglob("*") if f.is_file()]
        files = [f for f in files if not f.name.startswith(".warmfleet")]
        if (
            len(files) != 1
            or files[0].stat().st_size != size_bytes
            or _sha256(files[0]) != want_sha256
        ):
            bad += 1
    return bad


async def _kill_mid_transfer(fleet: EmbeddedFleet, victim: str, out: dict[str, Any]) -> None:
    """SIGKILL ``victim``'s agent once it holds a third of the pieces (peers fetch from it)."""
    while True:
        for version in fleet.tracker.tracker.versions.values():
            node = version.nodes.get(victim)
            if node is not None and version.pieces and len(node.have) >= version.pieces // 3:
                pid = fleet.agents[victim].pid
                os.kill(pid, signal.SIGKILL)
                out.update({"killed_node": victim, "killed_holding_pieces": len(node.have)})
                fleet.event("fault_kill_agent", node=victim, pid=pid)
                return
        await asyncio.sleep(0.02)


async def _advertise_bad(fleet: EmbeddedFleet, bad: list[BadPeer]) -> None:
    """Keep the bad peers offered until cancelled: they report like live nodes (a node silent
    for the tracker's stall bound is no longer offered), once a version exists and every second
    after."""
    while True:
        seen = advertise(fleet.tracker.tracker, bad)
        await asyncio.sleep(1.0 if seen else 0.02)


async def fill_run(
    workdir: Path,
    *,
    nodes: int,
    size_bytes: int,
    throttle_bps: int,
    peers: bool,
    piece_bytes: int = 4 << 20,
    faults: tuple[str, ...] = (),
    timeout_s: float = 240.0,
) -> dict[str, Any]:
    config = p2p_config(
        workdir, nodes, size_bytes, throttle_bps, peers=peers, piece_bytes=piece_bytes
    )
    stop = asyncio.Event()
    kinds = [k for k, fault in (("flip", "flip_bytes"), ("stall", "stall")) if fault in faults]
    bad = [BadPeer(f"bad-{k}", k, workdir / "origin") for k in kinds]
    fault_out: dict[str, Any] = {}
    async with EmbeddedFleet(config) as fleet, asyncio.TaskGroup() as tg:
        runner = tg.create_task(fleet.run(stop))
        try:
            await wait_for("agents up", lambda: len(fleet.agent_urls) == nodes, 60.0)
            for peer in bad:
                await peer.start()
            started = time.monotonic()
            fleet.put_endpoint(ENDPOINT, _spec("v1", "all", 0))
            side = []
            if bad:
                side.append(tg.create_task(_advertise_bad(fleet, bad)))
            if "kill_peer" in faults:
                victim = sorted(fleet.world.nodes)[-1]
                side.append(tg.create_task(_kill_mid_transfer(fleet, victim, fault_out)))
            await wait_for("every node's cache ready", lambda: _all_ready(fleet), timeout_s)
            ready_s = time.monotonic() - started
            for task in side:
                task.cancel()
            figures = await _figures(fleet, workdir, size_bytes, ready_s)
            figures["bad_peer_requests"] = {p.name: p.requests for p in bad}
            figures.update(fault_out)
        finally:
            stop.set()
            for peer in bad:
                await peer.stop()
        await runner
    return figures


async def _figures(
    fleet: EmbeddedFleet, workdir: Path, size_bytes: int, ready_s: float
) -> dict[str, Any]:
    origin = workdir / "origin" / origin_file(ENDPOINT, "v1")
    want = await asyncio.to_thread(_sha256, origin)
    totals = {"bytesFromPeers": 0, "bytesFromOrigin": 0, "piecesRejected": 0, "peersDropped": 0}
    async with aiohttp.ClientSession() as session:
        stats = await _json(session, fleet.origin_url + "/stats")
        for url in fleet.agent_urls.values():
            doc = await _json(session, url + "/v1/fleet/caches")
            for k in totals:
                totals[k] += int((doc.get("peers") or {}).get(k, 0))
    origin_bytes = int(stats["bytesServed"])
    tracker: dict[str, Any] = next(iter(fleet.tracker.snapshot().values()), {})
    return {
        "nodes": len(fleet.world.nodes),
        "all_nodes_ready_s": round(ready_s, 2),
        "origin_bytes": origin_bytes,
        "origin_bytes_ratio": round(origin_bytes / size_bytes, 3),
        "bytes_from_peers": totals["bytesFromPeers"],
        "bytes_from_origin_by_nodes": totals["bytesFromOrigin"],
        "pieces_rejected": totals["piecesRejected"],
        "peers_dropped": totals["peersDropped"],
        "corrupt_or_partial_published": await asyncio.to_thread(
            bad_published, fleet, want, size_bytes
        ),
        "tracker": {k: v for k, v in tracker.items() if k != "nodes"},
    }


async def run_all(
    workdir: Path, nodes: int, size_bytes: int, throttle_bps: int, piece_bytes: int
) -> dict[str, Any]:
    async def one(name: str, *, peers: bool, faults: tuple[str, ...] = ()) -> dict[str, Any]:
        return await fill_run(
            workdir / name,
            nodes=nodes,
            size_bytes=size_bytes,
            throttle_bps=throttle_bps,
            peers=peers,
            piece_bytes=piece_bytes,
            faults=faults,
        )

    no_p2p = await one("no-p2p", peers=False)
    p2p = await one("p2p", peers=True)
    faults = await one("faults", peers=True, faults=FAULTS)
    faults["faults"] = list(FAULTS)
    p2p["clean_pieces_rejected"] = p2p["pieces_rejected"]
    p2p["pieces_rejected"] = faults["pieces_rejected"]  # the fault run's (the clean one: 0)
    p2p["faults"] = faults
    p2p["origin_fetches_k"] = 1
    p2p["piece_bytes"] = piece_bytes
    return {
        "p2p": p2p,
        "no_p2p": no_p2p,
        "p2p_ready_ratio": round(p2p["all_nodes_ready_s"] / no_p2p["all_nodes_ready_s"], 3),
        "p2p_params": {
            "nodes": nodes,
            "model_bytes": size_bytes,
            "origin_throttle_bps": throttle_bps,
            "piece_bytes": piece_bytes,
            "origin_fetches_k": 1,
        },
    }


def p2p_command(
    out: OutOpt = DEFAULT_OUT,
    nodes: Annotated[int, typer.Option(help="node agents")] = 6,
    size: SizeOpt = 300_000_000,
    throttle: ThrottleOpt = 100_000_000,
    piece: Annotated[int, typer.Option(help="piece bytes")] = 4 << 20,
    max_s: MaxSOpt = 400.0,
) -> None:
    """Peer distribution vs origin-only on the embedded fleet; prints the summary line."""

    async def bounded(workdir: Path) -> dict[str, Any]:
        async with asyncio.timeout(max_s):
            return await run_all(workdir, nodes, size, throttle, piece)

    with tempfile.TemporaryDirectory(prefix="warmfleet-p2p-", dir="/var/tmp") as tmp:
        figures = asyncio.run(bounded(Path(tmp)))
    merge_into(out, figures)
    summary = {
        "p2p.origin_bytes_ratio": figures["p2p"]["origin_bytes_ratio"],
        "no_p2p.origin_bytes_ratio": figures["no_p2p"]["origin_bytes_ratio"],
        "p2p.all_nodes_ready_s": figures["p2p"]["all_nodes_ready_s"],
        "no_p2p.all_nodes_ready_s": figures["no_p2p"]["all_nodes_ready_s"],
        "p2p_ready_ratio": figures["p2p_ready_ratio"],
        "p2p.pieces_rejected": figures["p2p"]["pieces_rejected"],
        "faults.corrupt_or_partial_published": figures["p2p"]["faults"][
            "corrupt_or_partial_published"
        ],
    }
    print(json.dumps(summary))


def main() -> None:
    typer.run(p2p_command)


if __name__ == "__main__":
    main()
