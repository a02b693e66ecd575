"""In-process warmfleet gateway replicas for the e2e, built exactly as ``warmfleet serve --config``
builds them: a ``kind: Gateway`` YAML document (``spec.tokenizerPath`` for the ``tokens`` key
mode, ``spec.kvEvents`` for exact mode) written to disk, ``load_gateway_config`` and
``create_app`` with no injected router factory. In exact mode each replica's subscriber connects
to the KV-event relay that the engines publish to (``kvEvents.bind: false``). With
``replica_sync_sections`` the replicas share their routings over loopback (``spec.replicaSync``,
docs/replicas.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from vllm_harness.engines import (
    MODEL_NAME,
    REPLAY_PORT_OFFSET,
    EngineSpec,
    reset_prefix_cache,
)
from warmfleet.gateway.app import create_app
from warmfleet.gateway.config import load_gateway_config
from warmfleet.gateway.kv_events import KvEventFeed
from warmfleet.gateway.runtime import Gateway
from warmfleet.gateway.server import StartedApp, start_app

BLOCK_SIZE = 128


def gateway_document(
    strategy: dict[str, Any],
    engines: Sequence[EngineSpec],
    seed: int,
    *,
    tokenizer_path: str,
    kv_events_endpoint: str | None,
    replica_sync: dict[str, Any] | None = None,
    capture_path: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "seed": seed,
        "health": {"intervalS": 5.0, "timeoutS": 4.0},
        "limits": {"upstreamReadTimeoutS": 120.0},
        "tokenizerPath": tokenizer_path,
        "endpoints": [
            {
                "name": "e2e",
                "variants": [
                    {
                        "name": "main",
                        "models": [MODEL_NAME],
                        "routing": {
                            "strategy": strategy,
                            "key": {"mode": "tokens", "blockSize": BLOCK_SIZE},
                        },
                        "instances": [{"id": e.instance_id, "url": e.url} for e in engines],
                    }
                ],
            }
        ],
    }
    if kv_events_endpoint is not None:
        spec["kvEvents"] = {
            "endpoint": kv_events_endpoint,
            "bind": False,
            "resyncBatches": 3,
            "replay": {"portOffset": REPLAY_PORT_OFFSET, "timeoutS": 30.0},
        }
    if replica_sync is not None:
        spec["replicaSync"] = replica_sync
    if capture_path is not None:  # traffic capture (issue 26): vllm_harness.doctor replays it
        spec["capture"] = {"path": capture_path}
    return {"apiVersion": "warmfleet.dev/v1alpha1", "kind": "Gateway", "spec": spec}


def replica_sync_sections(count: int, base_port: int) -> list[dict[str, Any]]:
    """``spec.replicaSync`` of ``count`` replicas on loopback: replica ``i``'s sync socket on
    ``base_port + 2i`` (its catch-up socket on the next port), every other one its peer."""
    endpoints = [f"tcp://127.0.0.1:{base_port + 2 * i}" for i in range(count)]
    return [
        {
            "replicaId": f"e2e-replica-{i}",
            "listen": {"host": "127.0.0.1", "port": base_port + 2 * i},
            "peers": {"type": "static", "endpoints": endpoints[:i] + endpoints[i + 1 :]},
            "catchUpTimeoutS": 10.0,
        }
        for i in range(count)
    ]


@dataclass
class Replica:
    started: StartedApp
    config_path: Path

    @property
    def url(self) -> str:
        return self.started.url

    @property
    def gateway(self) -> Gateway:
        return self.started.gateway

    @property
    def feed(self) -> KvEventFeed | None:
        service = self.started.gateway.kv_events
        return service.feed if service is not None else None

    async def stop(self) -> None:
        await self.started.stop()  # the lifespan stops the KV-event subscriber too


async def start_replica(
    strategy: dict[str, Any],
    engines: Sequence[EngineSpec],
    model_dir: Path,
    config_dir: Path,
    *,
    relay_endpoint: str | None,
    seed: int,
    name: str,
    replica_sync: dict[str, Any] | None = None,
    capture_path: str | None = None,
) -> Replica:
    """One gateway from a config file; with ``relay_endpoint`` its KV events come from there;
    with ``replica_sync`` it shares its routings with its peers; with ``capture_path`` it
    captures its traffic there (written out when it stops)."""
    document = gateway_document(
        strategy,
        engines,
        seed,
        tokenizer_path=str(model_dir),
        kv_events_endpoint=relay_endpoint,
        replica_sync=replica_sync,
        capture_path=capture_path,
    )
    config_dir.mkdir(parents=True, exist_ok=True)
    path = config_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    app = create_app(load_gateway_config(path), config_path=path)
    return Replica(await start_app(app), path)


async def sync_exact(
    replicas: Sequence[Replica],
    engines: Sequence[EngineSpec],
    session: aiohttp.ClientSession,
    timeout_s: float = 60.0,
) -> float:
    """Reset every engine's prefix cache until every replica's feed is exact for every engine
    (the reset's ``AllBlocksCleared`` is the resync point; a subscriber that just connected may
    miss the first frames, so this repeats). Returns the seconds it took."""
    start = time.monotonic()
    wanted = {e.instance_id for e in engines}
    while True:
        for engine in engines:
            await reset_prefix_cache(session, engine.url)
        await asyncio.sleep(0.5)
        if all(_exact_ids(r) >= wanted for r in replicas):
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            modes = [r.feed.describe() if r.feed else {} for r in replicas]
            raise RuntimeError(f"KV-event feeds not in sync after {timeout_s:.0f} s: {modes}")
        await asyncio.sleep(1.0)


async def wait_caught_up(replicas: Sequence[Replica], timeout_s: float = 30.0) -> float:
    """Until every synced replica caught up with its peers (what its ``/ready`` waits for);
    the seconds it took."""
    start = time.monotonic()
    while not all(
        r.gateway.replica_sync is None or r.gateway.replica_sync.caught_up for r in replicas
    ):
        if time.monotonic() - start > timeout_s:
            raise RuntimeError(f"replicas not caught up after {timeout_s:.0f} s")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


def delivered(states: Sequence[Mapping[str, Any]]) -> bool:
    """Every replica's notes so far were heard by every peer: none queued, and each peer's last
    batch heard from it is its last sent (``states``: ``ReplicaSync.describe`` of each)."""
    return all(
        s["notes_queued"] == 0
        and all(
            t["last_batch_heard"].get(s["origin"], 0) >= s["batches_sent"]
            for t in states
            if t is not s
        )
        for s in states
    )


class DeliveryWaits:
    """The client's think time in the synced runs: after each request, until what it made the
    replicas send reached every peer (``delivered``; the peers read their socket on their
    ``applyDelayMs``), at most ``timeout_s``. A routing on a state a stalled note has not
    reached yet is the staleness the simulator's ``--sync-delay-ms`` sweep measures; on these 2
    shared cores a note has waited ~300 ms for a ZeroMQ I/O thread, and one cold start placed
    on that stale view costs the e2e's tight caches ~2 points (docs/real-vllm.md)."""

    def __init__(self, replicas: Sequence[Replica], timeout_s: float = 2.0) -> None:
        self.syncs = [r.gateway.replica_sync for r in replicas if r.gateway.replica_sync]
        self.timeout_s = timeout_s
        self.waits_s: list[float] = []
        self.timeouts = 0

    async def __call__(self) -> None:
        start = time.monotonic()
        while not delivered([sync.describe() for sync in self.syncs]):
            if time.monotonic() - start >= self.timeout_s:
                self.timeouts += 1
                break
            await asyncio.sleep(0.005)
        self.waits_s.append(time.monotonic() - start)

    def summary_ms(self) -> dict[str, float]:
        """The waits: p50, p99, max (ms), how many, and how many ran out of time."""
        return {**_quantiles_ms(self.waits_s, counted="requests"), "timeouts": self.timeouts}


def sync_delays_ms(replicas: Sequence[Replica]) -> dict[str, float]:
    """The observed propagation delays (every batch received by every replica): p50, p99, max."""
    return _quantiles_ms(
        d
        for r in replicas
        if r.gateway.replica_sync is not None
        for d in r.gateway.replica_sync.metrics.recent_delays_s
    )


def kv_event_delays_ms(replicas: Sequence[Replica]) -> dict[str, float]:
    """How late the engines' KV event batches reached the gateways (engine stamp to arrival,
    every batch of every replica): p50, p99, max."""
    return _quantiles_ms(d for r in replicas if r.feed is not None for d in r.feed.recent_delays_s)


def _quantiles_ms(delays_s: Iterable[float], counted: str = "batches") -> dict[str, float]:
    delays = sorted(d * 1000.0 for d in delays_s)
    if not delays:
        return {}

    def at(q: float) -> float:
        return round(delays[min(len(delays) - 1, int(q * (len(delays) - 1)))], 2)

    return {"p50": at(0.5), "p99": at(0.99), "max": round(delays[-1], 2), counted: len(delays)}


def _exact_ids(replica: Replica) -> set[str]:
    if replica.feed is None:
        return set()
    return {iid for iid, mode in replica.feed.modes().items() if mode == "exact"}


class LoopLag:
    """How late this process's event loop runs a timer (``interval_s`` sleeps, overshoot
    recorded) while a case runs: the gateways and the client share that loop, so a note's
    propagation delay includes any stall of it."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.lags_s: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.lags_s.append(max(0.0, loop.time() - due))

    def __enter__(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="e2e-loop-lag")
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._task is not None:
            self._task.cancel()

    def summary_ms(self) -> dict[str, float]:
        lags = sorted(lag * 1000.0 for lag in self.lags_s)
        if not lags:
            return {}
        p99 = lags[min(len(lags) - 1, int(0.99 * (len(lags) - 1)))]
        return {"p50": round(lags[len(lags) // 2], 2), "p99": round(p99, 2),
                "max": round(lags[-1], 2), "samples": len(lags)}  # fmt: skip


def decision_reasons(replicas: Sequence[Replica]) -> dict[str, int]:
    """The replicas' proxied requests by routing reason (``requests_total``), summed."""
    counts: dict[str, int] = {}
    for replica in replicas:
        for family in replica.gateway.metrics.registry.collect():
            if family.name != "warmfleet_gateway_requests":
                continue
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    reason = sample.labels["reason"]
                    counts[reason] = counts.get(reason, 0) + int(sample.value)
    return dict(sorted(counts.items()))


def kv_capacities(replicas: Sequence[Replica]) -> list[int]:
    """The distinct KV capacities (tokens) the replicas read from the engines' metrics (0: an
    instance whose capacity they did not learn)."""
    return sorted(
        {
            inst.kv_capacity_tokens
            for replica in replicas
            for variant in replica.gateway.state.variants()
            for inst in variant.instances.values()
        }
    )


def engine_stats_read(replicas: Sequence[Replica]) -> list[bool]:
    """Whether the replicas read each instance's queue and KV usage from its metrics (the
    distinct answers: ``[True]`` when every instance's were read, ``[False]`` when none were, as
    for a strategy that does not ask for them)."""
    return sorted(
        {
            inst.engine_stats_read_s > 0
            for replica in replicas
            for variant in replica.gateway.state.variants()
            for inst in variant.instances.values()
        }
    )
