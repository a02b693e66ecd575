"""bench-peers' runs: the overhead workload, the order of the runs (direct runs bracketing
every router, alternating), peer paths and labels, the process set, warmfleet's flowed, synced
and capturing routers started for real, and a reference proxy on a taken port."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from warmfleet.api.trace_format import parse_trace
from warmfleet.bench.live_fleet import FleetHandle, start_fleet
from warmfleet.bench.live_procs import Child, ProcessSet, free_port, tree_cpu_s
from warmfleet.bench.peers import FAST_FLEET, overhead_order, overhead_workload
from warmfleet.bench.peers_routers import (
    CAPTURED_PREFIX_AFFINITY,
    FLOWED_PREFIX_AFFINITY,
    SYNCED_PREFIX_AFFINITY,
    PeerPaths,
    RouterSpec,
    RunningRouter,
    start_router,
)
from warmfleet.sim.workloads.base import render_prompt_text


def test_overhead_workload_is_8k_chars_with_shared_prefixes() -> None:
    requests = overhead_workload(40)
    assert len(requests) == 40
    lengths = [len(render_prompt_text(r.segments)) for r in requests]
    assert all(7000 < n < 9000 for n in lengths)
    assert len({r.segments[0].content_id for r in requests}) == 8
    assert len({r.segments[1].content_id for r in requests}) == 40


def test_peer_paths_and_labels(tmp_path: Path) -> None:
    paths = PeerPaths(tmp_path / "missing-python", None)
    assert not paths.available(RouterSpec("sglang-router", "cache_aware"))
    assert not paths.available(RouterSpec("vllm-router", "round_robin"))
    assert paths.available(RouterSpec("warmfleet", "random"))
    assert RouterSpec("direct", "x").label == "direct"
    assert RouterSpec("vllm-router", "round_robin").label == "vllm-router/round_robin"


def test_process_set_stops_children_by_pid(tmp_path: Path) -> None:
    procs = ProcessSet(tmp_path)
    code = "import time\nprint('up', flush=True)\ntime.sleep(60)"
    child = procs.start("sleeper", [sys.executable, "-c", code])
    assert child.alive()
    assert tree_cpu_s(os.getpid()) >= 0.0
    procs.stop_all()
    assert not child.alive()
    assert procs.children == []
    assert 0 < free_port() < 65536


def test_overhead_order_brackets_every_router_and_alternates() -> None:
    routers = [
        RouterSpec("direct", "client_round_robin"),
        RouterSpec("warmfleet", "prefix_affinity"),
        RouterSpec("vllm-router", "round_robin"),
    ]
    labels = [[r.label for r in overhead_order(routers, i)] for i in range(3)]
    assert labels[0] == [
        "direct",
        "warmfleet/prefix_affinity",
        "direct",
        "vllm-router/round_robin",
        "direct",
    ]
    assert labels[1] == [
        "direct",
        "vllm-router/round_robin",
        "direct",
        "warmfleet/prefix_affinity",
        "direct",
    ]
    assert labels[2] == labels[0]


@pytest.mark.slow
async def test_the_flowed_router_sends_every_request_through_its_gate(tmp_path: Path) -> None:
    """``warmfleet/prefix_affinity+flow``: one gateway process with ``routing.flow`` whose cap
    no bench point reaches: requests pass the gate and none waits."""
    async with _warmfleet_router(tmp_path, FLOWED_PREFIX_AFFINITY) as (fleet, _router, url):
        await _three_completions(url, fleet.model)
        async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
            text = await resp.text()
    waits = [
        line for line in text.splitlines()
        if line.startswith("warmfleet_gateway_flow_wait_seconds_count")
    ]  # fmt: skip
    assert waits
    assert sum(float(line.rsplit(" ", 1)[1]) for line in waits) == 3
    assert 'outcome="shed"' not in "".join(waits)


@pytest.mark.slow
async def test_the_synced_router_is_two_replicas_sharing_notes(tmp_path: Path) -> None:
    """``warmfleet/prefix_affinity+sync``: two gateway processes with replica sync in front of
    one fleet; a request through the first is known to the second (its admin view)."""
    async with _warmfleet_router(tmp_path, SYNCED_PREFIX_AFFINITY) as (fleet, router, url):
        assert len(router.children) == 2
        assert [c.alive() for c in router.children] == [True, True]
        async with aiohttp.ClientSession() as session:
            body = {"model": fleet.model, "prompt": "hello " * 50, "max_tokens": 2}
            async with session.post(url + "/v1/completions", json=body) as resp:
                assert resp.status == 200
        peer_doc = json.loads((tmp_path / "warmfleet-prefix_affinity+sync-1.json").read_text())
        assert peer_doc["spec"]["replicaSync"]["peers"]["endpoints"]
        peer_url = f"http://127.0.0.1:{peer_doc['spec']['listen']['port']}"
        await _wait_peer_learnt(peer_url, router.children[1])


@pytest.mark.slow
async def test_the_capturing_router_writes_a_line_per_request(tmp_path: Path) -> None:
    """``warmfleet/prefix_affinity+capture``: one gateway process with capture on, its file
    next to its document; a line per answered request once it stops."""
    async with _warmfleet_router(tmp_path, CAPTURED_PREFIX_AFFINITY) as (fleet, _router, url):
        await _three_completions(url, fleet.model)
    capture = tmp_path / "warmfleet-prefix_affinity+capture.capture.jsonl"
    trace = parse_trace(capture.read_text().splitlines(), str(capture))
    assert len(trace.records) == 3
    assert trace.header.fleet.strategy is not None
    assert trace.header.fleet.strategy["type"] == "prefix_affinity"


async def _wait_peer_learnt(peer_url: str, peer: Child) -> None:
    """The peer heard a note: published to it, or replayed from a log (its subscription can
    join after the note went out)."""
    metrics = (
        "warmfleet_gateway_replica_sync_notes_received_total",
        "warmfleet_gateway_replica_sync_catch_up_notes_total",
    )
    async with aiohttp.ClientSession() as session:
        for _ in range(100):
            async with session.get(peer_url + "/metrics") as resp:
                text = await resp.text()
            received = [
                float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith(metrics)
            ]  # fmt: skip
            if sum(received) >= 1:
                return
            await asyncio.sleep(0.1)
    raise AssertionError(f"the peer never received a note:\n{peer.log_tail()}")


@pytest.mark.parametrize(
    "module", ["warmfleet.bench.passthrough", "warmfleet.bench.protocol_passthrough"]
)
def test_reference_proxy_on_a_taken_port_is_one_line_and_fails(module: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [sys.executable, "-m", module, "--port", str(port), "http://127.0.0.1:9"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0
    assert "address already in use" in done.stderr  # what bench-peers' start retry looks for


async def _three_completions(url: str, model: str) -> None:
    """Three completions of distinct prompts through the router at ``url``, each answered."""
    async with aiohttp.ClientSession() as session:
        for i in range(3):
            body = {"model": model, "prompt": f"hello {i} " * 50, "max_tokens": 2}
            async with session.post(url + "/v1/completions", json=body) as resp:
                assert resp.status == 200


@contextlib.asynccontextmanager
async def _warmfleet_router(
    tmp_path: Path, policy: str
) -> AsyncIterator[tuple[FleetHandle, RunningRouter, str]]:
    """bench-peers' fast two-instance fleet and warmfleet's ``policy`` router in front of it,
    as child processes stopped (by PID) on the way out: the fleet, the router and its URL."""
    procs = ProcessSet(tmp_path)
    try:
        fleet = await start_fleet(procs, name="fleet", instances=2, spec=FAST_FLEET)
        spec = RouterSpec("warmfleet", policy)
        router = await start_router(procs, spec, PeerPaths(None, None), fleet)
        assert router.url is not None
        yield fleet, router, router.url
    finally:
        procs.stop_all()
