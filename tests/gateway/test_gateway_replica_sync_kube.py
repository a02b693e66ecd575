"""Replica-sync peers from the gateway's own Service (``peers: {type: kubernetes}``) against
kmock's API emulator: each replica finds the others' ready endpoints at the ``sync`` port,
leaves itself out by pod name, and their notes flow."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from gateway_support import MODEL, backends_running
from prometheus_client import CollectorRegistry
from replica_sync_support import endpoint, hears, stub_pair, sync_ports
from test_gateway_kube_discovery import NS, SLICES, declare

from support.waiting import wait_until
from warmfleet.gateway.replica_sync.config import ReplicaSyncConfig
from warmfleet.gateway.replica_sync.peers import peers_from_slices
from warmfleet.gateway.replica_sync.service import ReplicaSync
from warmfleet.gateway.server import StartedApp


def _slice(pod: str, port: int, ready: bool) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"gw-{pod}",
            "namespace": NS,
            "labels": {"kubernetes.io/service-name": "gw"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "sync", "port": port}, {"name": "http", "port": 8080}],
        "endpoints": [
            {
                "addresses": ["127.0.0.1"],
                "conditions": {"ready": ready},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": NS},
            }
        ],
    }


def _sync(pod: str, port: int, api: str) -> dict[str, Any]:
    peers = {
        "type": "kubernetes",
        "service": "gw",
        "namespace": NS,
        "api_server": api,
        "token_path": "/nonexistent/token",
        "ca_path": "/nonexistent/ca.crt",
        "retry_interval_s": 0.05,
        "timeout_s": 2.0,
    }
    return {"replica_id": pod, "listen": {"port": port}, "peers": peers}


def _replica(app: StartedApp) -> ReplicaSync:
    sync = app.gateway.replica_sync
    assert sync is not None
    return sync


async def test_peers_are_the_ready_endpoints_of_the_gateways_service(
    kmock: Any, session: aiohttp.ClientSession
) -> None:
    declare(kmock)
    api = str(kmock.url).rstrip("/")
    port_a, port_b, port_c = sync_ports(3)
    await session.post(api + SLICES, json=_slice("gw-a", port_a, True))
    await session.post(api + SLICES, json=_slice("gw-b", port_b, True))
    await session.post(api + SLICES, json=_slice("gw-c", port_c, False))  # not ready: left out
    sync_a, sync_b = _sync("gw-a", port_a, api), _sync("gw-b", port_b, api)
    async with (
        backends_running("b0") as backends,
        stub_pair(backends, sync_a, sync_b) as (a, b),
    ):
        await wait_until(lambda: _replica(a).peers.current == frozenset({endpoint(port_b)}))
        await wait_until(lambda: _replica(b).peers.current == frozenset({endpoint(port_a)}))
        await wait_until(lambda: _replica(b).caught_up)
        await wait_until(lambda: hears(_replica(b), _replica(a)))
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        async with session.post(a.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
        await wait_until(lambda: _replica(b).metrics.received.value == 2)


def test_a_replica_named_apart_from_its_pod_still_leaves_its_pod_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``replicaId`` set explicitly: the Service's endpoints still name the replica by its pod,
    which must not become its own peer (it would wait to hear itself at every start)."""
    monkeypatch.setenv("POD_NAME", "gw-0")
    config = ReplicaSyncConfig.model_validate(
        {"replica_id": "edge-a", "peers": {"type": "kubernetes", "service": "gw", "port": "sync"}}
    )
    sync = ReplicaSync(config, CollectorRegistry())
    assert sync.replica_id == "edge-a"
    slices = [_slice("gw-0", 9470, True), _slice("gw-1", 9470, True)]
    slices[1]["endpoints"][0]["addresses"] = ["127.0.0.2"]
    sync.peers.publish(peers_from_slices(slices, "sync", sync.peers.own_id))
    assert sync.peers.current == frozenset({"tcp://127.0.0.2:9470"})
