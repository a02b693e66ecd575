"""Gateway replicas with ``spec.replicaSync`` on loopback, for the replica-sync tests: free
port pairs (the sync socket and the catch-up socket on the next port), the documents, and a
peers file per replica (rewritten to cut or heal a partition)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from gateway_support import MODEL as STUB_MODEL
from gateway_support import FakeBackend, gateway_running

from warmfleet.edge import free_port
from warmfleet.gateway.app import create_app
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.replica_sync.service import ReplicaSync
from warmfleet.gateway.server import StartedApp, start_app

MODEL = "warmfleet-emulated"
ADMIN_TOKEN = "replica-sync-admin-token"


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def sync_ports(count: int) -> list[int]:
    """``count`` ports ``p`` of 127.0.0.1 with ``p`` and ``p + 1`` free (pairs kept apart),
    picked as ``edge.free_port`` picks: below the kernel's ephemeral range, where a port cannot
    become a connection's source port between the pick and the bind (seen in CI: "address
    already in use")."""
    found: list[int] = []
    while len(found) < count:
        port = free_port()
        if _bindable(port + 1) and all(abs(port - other) > 1 for other in found):
            found.append(port)
    return found


def endpoint(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


def sync_section(name: str, port: int, peers: list[int], **extra: Any) -> dict[str, Any]:
    """``spec.replicaSync`` of replica ``name`` on ``port`` with static ``peers`` (ports), short
    heartbeats and peer timeout (``extra`` overrides or adds fields)."""
    return {
        "replica_id": name,
        "listen": {"port": port},
        "peers": {"type": "static", "endpoints": [endpoint(p) for p in peers]},
        "heartbeat_interval_s": 0.1,
        "peer_timeout_s": 0.5,
        **extra,
    }


def replica_doc(
    urls: Sequence[str],
    replica_id: str,
    port: int,
    peers: dict[str, Any] | None,
    *,
    strategy: dict[str, Any] | None = None,
    block_size: int = 16,
    **sync: Any,
) -> dict[str, Any]:
    """A gateway in front of ``urls``; ``peers`` None: no replica sync."""
    variant = {
        "name": "v1",
        "models": [MODEL],
        "routing": {
            "strategy": strategy or {"type": "prefix_affinity", "use_exact_index": False},
            "key": {"block_size": block_size},
        },
        "instances": [{"id": f"emu-{i}", "url": url} for i, url in enumerate(urls)],
    }
    spec: dict[str, Any] = {
        "health": {"interval_s": 0.2, "timeout_s": 0.2},
        "endpoints": [{"name": "main", "variants": [variant]}],
    }
    if peers is not None:
        spec["replica_sync"] = {
            "replica_id": replica_id,
            "listen": {"host": "127.0.0.1", "port": port},
            "peers": peers,
            **sync,
        }
    return {"apiVersion": "warmfleet.dev/v1alpha1", "kind": "Gateway", "spec": spec}


def stub_doc(backends: Sequence[FakeBackend], sync: dict[str, Any] | None, strategy: str) -> Any:
    """A gateway in front of stub backends (``gateway_support.FakeBackend``), one variant
    ``main/v1``; ``sync``: its ``spec.replicaSync`` (None: off)."""
    spec: dict[str, Any] = {
        "health": {"interval_s": 0.2, "timeout_s": 0.2},
        "admin": {"token": ADMIN_TOKEN},
        "endpoints": [
            {
                "name": "main",
                "variants": [
                    {
                        "name": "v1",
                        "models": [STUB_MODEL],
                        "routing": {"strategy": {"type": strategy}},
                        "instances": [{"id": b.name, "url": b.url} for b in backends],
                    }
                ],
            }
        ],
    }
    if sync is not None:
        spec["replica_sync"] = sync
    return {"apiVersion": "warmfleet.dev/v1alpha1", "kind": "Gateway", "spec": spec}


def hears(listener: ReplicaSync, speaker: ReplicaSync) -> bool:
    """``listener`` heard ``speaker``'s stream over its subscription (a note ``speaker`` sends
    before that is dropped by its PUB, as for any subscriber not yet connected)."""
    heard = listener.describe()["last_batch_heard"]
    return isinstance(heard, dict) and speaker.origin in heard


@asynccontextmanager
async def stub_pair(
    backends: Sequence[FakeBackend], sync_a: dict[str, Any], sync_b: dict[str, Any]
) -> AsyncIterator[tuple[StartedApp, StartedApp]]:
    """Two ``prefix_affinity`` gateways in front of ``backends`` with these ``spec.replicaSync``
    sections (``stub_doc``), both started."""
    doc_a = stub_doc(backends, sync_a, "prefix_affinity")
    doc_b = stub_doc(backends, sync_b, "prefix_affinity")
    async with (
        gateway_running(parse_gateway_config(doc_a)) as a,
        gateway_running(parse_gateway_config(doc_b)) as b,
    ):
        yield a, b


@dataclass
class Replicas:
    """``count`` replicas in front of ``urls``; each reads its peers from its own file."""

    urls: Sequence[str]
    directory: Path
    count: int
    synced: bool = True
    sync: dict[str, Any] = field(default_factory=dict)
    ports: list[int] = field(default_factory=list)
    started: list[StartedApp | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ports = sync_ports(self.count)
        self.started = [None] * self.count

    def peers_file(self, index: int) -> Path:
        return self.directory / f"peers-{index}.json"

    def write_peers(self, index: int, others: Sequence[int]) -> None:
        """Replica ``index`` hears the replicas ``others``."""
        path = self.peers_file(index)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([endpoint(self.ports[o]) for o in others]))
        tmp.replace(path)

    def connect_all(self) -> None:
        for i in range(self.count):
            self.write_peers(i, [o for o in range(self.count) if o != i])

    async def start(self, index: int) -> StartedApp:
        if not self.peers_file(index).exists():
            self.write_peers(index, [o for o in range(self.count) if o != index])
        peers = {"type": "file", "path": str(self.peers_file(index)), "poll_interval_s": 0.05}
        doc = replica_doc(
            self.urls,
            f"replica-{index}",
            self.ports[index],
            peers if self.synced else None,
            **self.sync,
        )
        started = await start_app(create_app(parse_gateway_config(doc)))
        self.started[index] = started
        return started

    async def start_all(self) -> None:
        for i in range(self.count):
            await self.start(i)

    def app(self, index: int) -> StartedApp:
        started = self.started[index]
        assert started is not None
        return started

    def sync_of(self, index: int) -> ReplicaSync:
        sync = self.app(index).gateway.replica_sync
        assert sync is not None
        return sync

    async def stop(self, index: int) -> None:
        started, self.started[index] = self.started[index], None
        if started is not None:
            await started.stop()

    async def kill(self, index: int) -> None:
        """As abrupt as in-process allows: the sync sockets close first (no last notes), then
        the server stops without grace (its requests are cut)."""
        started, self.started[index] = self.started[index], None
        assert started is not None
        sync = started.gateway.replica_sync
        assert sync is not None
        sync.close()
        try:
            await started.app.server.stop(grace_s=0.0)
        finally:
            await started.gateway.stop()

    async def stop_all(self) -> None:
        for i in range(self.count):
            await self.stop(i)

    async def wait_ready(
        self, index: int, session: aiohttp.ClientSession, timeout_s: float
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            async with session.get(self.app(index).url + "/ready") as resp:
                if resp.status == 200:
                    return
            if loop.time() > deadline:
                raise TimeoutError(f"replica {index} not ready in {timeout_s} s")
            await asyncio.sleep(0.05)


def write_yaml(path: Path, data: Any) -> None:
    path.write_text(yaml.safe_dump(data))
