"""Replica sync in the live gateway (issue 22), with stub backends: ``spec.replicaSync``
validation, peers from EndpointSlices and files, the ZeroMQ wire's bad frames and lost batches,
the shared load view between two replicas (and the admin view), catch-up before readiness and
its timeout, a busy sync port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import aiohttp
import pytest
from gateway_support import MODEL, FakeBackend, backends_running, gateway_running
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from replica_sync_support import ADMIN_TOKEN, stub_doc, sync_ports, sync_section

from support.waiting import wait_until
from warmfleet.api.replica_sync import BatchEncoder, ReplicaSyncError
from warmfleet.core.errors import ConfigError
from warmfleet.core.types import Decision, Reason, RoutingKey
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.replica_sync.config import ReplicaSyncConfig
from warmfleet.gateway.replica_sync.peers import parse_peer_list, peers_from_slices
from warmfleet.gateway.replica_sync.service import ReplicaSync
from warmfleet.gateway.replica_sync.transport import (
    HEADER,
    LOG_REQUEST,
    TOPIC,
    PayloadLog,
    batch_message,
    parse_batch,
    parse_log,
)
from warmfleet.gateway.server import StartedApp
from warmfleet.gateway.variant import VariantRuntime
from warmfleet.routing.parse import parse_chat
from warmfleet.routing.replica_notes import routed_note

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _sync_of(app: StartedApp) -> ReplicaSync:
    sync = app.gateway.replica_sync
    assert sync is not None
    return sync


def _variant(app: StartedApp) -> VariantRuntime:
    return app.gateway.state.endpoint("main").variant("v1")


@asynccontextmanager
async def _pair(
    backends: list[FakeBackend], strategy: str = "prefix_affinity"
) -> AsyncIterator[tuple[StartedApp, StartedApp]]:
    a, b = sync_ports(2)
    doc_a = stub_doc(backends, sync_section("a", a, [b]), strategy)
    doc_b = stub_doc(backends, sync_section("b", b, [a]), strategy)
    async with (
        gateway_running(parse_gateway_config(doc_a)) as gw_a,
        gateway_running(parse_gateway_config(doc_b)) as gw_b,
    ):
        yield gw_a, gw_b


def test_config_defaults_and_errors_name_the_field() -> None:
    config = ReplicaSyncConfig()
    assert config.listen.endpoint == "tcp://127.0.0.1:9470"
    assert config.peers.type == "static"
    assert config.resolved_replica_id()
    bad: list[tuple[dict[str, Any], str]] = [
        ({"peers": {"type": "static", "endpoints": ["http://x:1"]}}, "peers.static.endpoints.0"),
        ({"peers": {"type": "dns"}}, "spec.replicaSync.peers"),
        ({"peers": {"type": "kubernetes"}}, "peers.kubernetes.service"),
        ({"listen": {"port": 65535}}, "listen.port"),
        ({"heartbeat_interval_s": 1.0, "peer_timeout_s": 1.5}, "peerTimeoutS"),
        ({"heartbeat_interval_s": 0.1, "apply_delay_ms": 600, "peer_timeout_s": 0.7}, "applyDelay"),
        ({"apply_delay_ms": -1}, "applyDelayMs"),
        ({"batch_interval_ms": -1}, "batchIntervalMs"),
        ({"replica_id": "a b"}, "replicaId"),
        ({"leader": "a"}, "spec.replicaSync.leader"),
    ]
    for fields, named in bad:
        with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
            parse_gateway_config(stub_doc([], fields, "random"))


def test_peers_from_slices_and_files() -> None:
    slices: list[dict[str, Any]] = [
        {
            "metadata": {"labels": {"kubernetes.io/service-name": "gw"}},
            "addressType": "IPv4",
            "ports": [{"name": "sync", "port": 9470}, {"name": "http", "port": 8080}],
            "endpoints": [
                {"addresses": [ip], "conditions": {"ready": True}, "targetRef": ref}
                for ip, ref in (
                    ("10.0.0.1", {"kind": "Pod", "name": "gw-1"}),
                    ("10.0.0.2", {"kind": "Pod", "name": "gw-2"}),
                )
            ],
        }
    ]
    assert peers_from_slices(slices, "sync", "gw-1") == {"tcp://10.0.0.2:9470"}
    long_pod = "gateway-" + "x" * 70  # its id is cut and hashed: still left out
    slices[0]["endpoints"][0]["targetRef"] = {"kind": "Pod", "name": long_pod}
    assert peers_from_slices(slices, "sync", long_pod) == {"tcp://10.0.0.2:9470"}
    assert peers_from_slices(slices, "http", "gw-3") == {
        "tcp://10.0.0.1:8080",
        "tcp://10.0.0.2:8080",
    }
    assert parse_peer_list(["tcp://a:1"], "f") == {"tcp://a:1"}
    assert parse_peer_list({"endpoints": []}, "f") == frozenset()
    with pytest.raises(ConfigError, match=r"endpoints\.0"):
        parse_peer_list(["a:1"], "f")


async def test_bad_frames_are_counted_and_dropped_and_lost_batches_seen() -> None:
    sync = ReplicaSync(ReplicaSyncConfig(replica_id="r"), CollectorRegistry())
    key = RoutingKey((1, 2), 16, 2, 32, 7)
    note = routed_note("peer#1", "main/v1", 1, key, Decision("i", Reason.PREFIX_HIT))
    payload = BatchEncoder().encode([note])
    good = batch_message("peer#1", 0.0, 1, payload)
    assert parse_batch(good).payload == payload
    for message in (
        b"junk",
        good[: HEADER.size + 3],  # the origin cut short
        b"wf-snyc" + good[len(TOPIC) :],  # another topic
        batch_message("", 0.0, 1, payload),
        batch_message("peer#1", 0.0, 1, b"\xc1not msgpack"),
        good[: HEADER.size - 2] + b"\x02\x00\xff\xfe" + payload,  # an origin not UTF-8
    ):
        sync.receive(message)
    assert sync.metrics.dropped.labels("bad_frame")._value.get() == 6
    assert sync.metrics.bytes_received.value == 0  # a batch's bytes only
    sync.receive(good)  # no view for main/v1 here: received, applied nowhere, no crash
    assert sync.metrics.received.value == 1
    assert sync.metrics.bytes_received.value == len(good)
    assert not sync._resync.is_set()  # its first batch: nothing before it to miss
    sync.receive(batch_message("peer#1", 0.0, 4, BatchEncoder().encode([])))  # batches 2 and 3 lost
    assert sync.metrics.missed._value.get() == 2
    assert sync._resync.is_set()


async def test_a_subscription_that_joined_late_replays_the_peers_logs() -> None:
    """A PUB socket drops what it sends before a subscriber's connection is up: a replica
    whose first batch from a peer is not that peer's first asks the peers for their logs."""
    sync = ReplicaSync(ReplicaSyncConfig(replica_id="r"), CollectorRegistry())
    sync.receive(batch_message("peer#1", 0.0, 3, BatchEncoder().encode([])))  # a heartbeat, batch 3
    assert sync._resync.is_set()
    assert sync.metrics.missed._value.get() == 0  # not known to be lost: only not seen


_FRAMES = st.one_of(
    st.lists(st.binary(max_size=40), max_size=6),
    st.tuples(  # shaped like a log answer, with arbitrary contents
        st.just(LOG_REQUEST), st.binary(max_size=8), st.binary(max_size=60)
    ).map(list),
)
_MESSAGES = st.one_of(
    st.binary(max_size=80),
    st.tuples(  # shaped like a batch (topic, stamp, number, origin length), arbitrary after
        st.just(TOPIC),
        st.binary(min_size=16, max_size=16),
        st.integers(0, 70),
        st.binary(max_size=80),
    ).map(lambda t: t[0] + t[1] + t[2].to_bytes(2, "little") + t[3]),
)


@settings(max_examples=300, deadline=None)
@given(_MESSAGES, _FRAMES)
def test_any_message_is_a_batch_or_a_replica_sync_error(
    message: bytes, frames: list[bytes]
) -> None:
    with suppress(ReplicaSyncError):
        parse_batch(message)
    with suppress(ReplicaSyncError):
        parse_log(frames)


def test_the_catch_up_log_is_bounded_in_bytes() -> None:
    log = PayloadLog(limit_bytes=10)
    for payload in (b"aaaa", b"bbbb", b"cc"):
        log.add(payload)
    assert list(log.payloads) == [b"aaaa", b"bbbb", b"cc"]
    log.add(b"ddd")  # 13 bytes: the oldest goes
    assert list(log.payloads) == [b"bbbb", b"cc", b"ddd"]
    assert log.size_bytes == 9
    log.add(b"e" * 11)  # larger than the bound alone: nothing is kept
    assert not log.payloads
    assert log.size_bytes == 0


async def test_peers_see_each_others_in_flight_load() -> None:
    """The snapshot a replica's strategy chooses from carries its peer's in-flight requests,
    and they end when the peer's requests end."""
    async with backends_running("b0", "b1") as backends, _pair(backends, "round_robin") as (a, b):
        for backend in backends:
            backend.gate = asyncio.Event()
        # B's subscription to A works (a heartbeat heard): every note below arrives as a batch,
        # none only through a catch-up replay
        origin_a = _sync_of(a).origin
        await wait_until(lambda: origin_a in _sync_of(b)._last_batch, timeout_s=5.0)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with aiohttp.ClientSession() as session:

            async def one() -> int:
                async with session.post(a.url + "/v1/chat/completions", json=body) as resp:
                    await resp.read()
                    return resp.status

            requests = [asyncio.create_task(one()) for _ in range(4)]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5.0
            while sum(i.in_flight_requests for i in _variant(b).snapshot().instances) < 4:
                assert loop.time() < deadline, _variant(b).snapshot()
                await asyncio.sleep(0.01)
            seen_by_b = {
                i.instance_id: i.in_flight_requests for i in _variant(b).snapshot().instances
            }
            assert seen_by_b == {"b0": 2, "b1": 2}
            assert all(i.in_flight_requests == 0 for i in _variant(b).instances.values())
            # unchanged instances are the same objects from one snapshot to the next (the
            # strategy reads only the ones that moved); a capacity change makes a new one
            before = _variant(b).snapshot().instances
            again = _variant(b).snapshot().instances
            assert all(x is y for x, y in zip(before, again, strict=True))
            _variant(b).instances["b0"].set_kv_capacity(4096, 256)
            after = {i.instance_id: i for i in _variant(b).snapshot().instances}
            assert after["b0"] is not before[0]
            assert after["b1"] is before[1]
            assert (after["b0"].kv_capacity_blocks, after["b0"].in_flight_requests) == (256, 2)
            for backend in backends:
                assert backend.gate is not None
                backend.gate.set()
            assert await asyncio.gather(*requests) == [200] * 4
            while sum(i.in_flight_requests for i in _variant(b).snapshot().instances):
                assert loop.time() < deadline
                await asyncio.sleep(0.01)
        sync_b = b.gateway.replica_sync
        assert sync_b is not None
        assert sync_b.metrics.recent_delays_s
        async with (
            aiohttp.ClientSession() as session,
            session.get(b.url + "/admin/v1/replica-sync", headers=ADMIN) as resp,
        ):
            state = await resp.json()
        assert state["enabled"] is True
        assert state["peers"] == [_sync_of(a).endpoint]
        assert state["peers_heard"] == [origin_a]
        assert state["open_requests"] == {"main/v1": {origin_a: 0}}
        assert sync_b.metrics.received.value == 8  # 4 routed, 4 finished


async def test_a_replica_learns_its_peers_routings_and_catches_up_before_ready() -> None:
    """B starts after A routed a conversation: B replays A's log before it reports ready, and
    then predicts the cache A's routing filled."""
    port_a, port_b = sync_ports(2)
    messages = [{"role": "system", "content": "a long shared context " * 40}]
    body = {"model": MODEL, "messages": messages, "stream": False}
    async with backends_running("b0", "b1", "b2", "b3") as backends:
        doc_a = stub_doc(backends, sync_section("a", port_a, [port_b]), "prefix_affinity")
        doc_b = stub_doc(backends, sync_section("b", port_b, [port_a]), "prefix_affinity")
        async with gateway_running(parse_gateway_config(doc_a)) as a, aiohttp.ClientSession() as s:
            async with s.post(a.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
            async with gateway_running(parse_gateway_config(doc_b)) as b:
                sync_b = b.gateway.replica_sync
                assert sync_b is not None
                await _wait_ready(s, b.url)
                assert sync_b.caught_up
                assert sync_b.metrics.catch_up_notes._value.get() >= 2
                variant = _variant(b)
                key = variant.router.key(parse_chat({"model": MODEL, "messages": messages}))
                decision = variant.router.choose(key, variant.snapshot())
                assert decision.predicted_cached_blocks > 0, decision


async def test_a_peers_routings_reach_the_router_an_admin_change_put_in_place() -> None:
    """The view follows its variant's router of the moment: after ``PUT .../routing`` on both
    (another block size: a new router that starts empty), A's routings teach B's new router."""
    messages = [{"role": "system", "content": "another long shared context " * 40}]
    body = {"model": MODEL, "messages": messages, "stream": False}
    async with (
        backends_running("b0", "b1", "b2", "b3") as backends,
        _pair(backends) as (a, b),
        aiohttp.ClientSession() as session,
    ):
        old_router = _variant(b).router
        routing = {"strategy": {"type": "prefix_affinity"}, "key": {"block_size": 32}}
        for app in (a, b):
            url = app.url + "/admin/v1/endpoints/main/variants/v1/routing"
            async with session.put(url, json=routing, headers=ADMIN) as resp:
                assert resp.status == 200
        variant = _variant(b)
        assert variant.router is not old_router
        async with session.post(a.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
        key = variant.router.key(parse_chat({"model": MODEL, "messages": messages}))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while variant.router.choose(key, variant.snapshot()).predicted_cached_blocks == 0:
            assert loop.time() < deadline, "B's new router never learnt A's routing"
            await asyncio.sleep(0.01)


async def test_ready_after_catch_up_timeout_when_no_peer_answers() -> None:
    (port,) = sync_ports(1)
    (dead,) = sync_ports(1)
    async with backends_running("b0") as backends:
        sync = sync_section("lonely", port, [dead], catch_up_timeout_s=0.6)
        async with (
            gateway_running(parse_gateway_config(stub_doc(backends, sync, "random"))) as gw,
            aiohttp.ClientSession() as session,
        ):
            async with session.get(gw.url + "/ready") as resp:
                assert resp.status == 503
                assert (await resp.json())["replica_sync"]["caught_up"] is False
            await _wait_ready(session, gw.url)
            replica = gw.gateway.replica_sync
            assert replica is not None
            assert replica.catch_up_s is not None
            assert replica.catch_up_s >= 0.6
            assert replica.metrics.catch_up_timeouts._value.get() == 1


async def _wait_ready(session: aiohttp.ClientSession, url: str, timeout_s: float = 5.0) -> None:
    """Until ``/ready`` says 200 (never before the replica caught up)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        async with session.get(url + "/ready") as resp:
            body = await resp.json()
            assert resp.status == 503 or body["replica_sync"]["caught_up"], body
            if resp.status == 200:
                return
        assert loop.time() < deadline, "not ready in time"
        await asyncio.sleep(0.02)


async def test_a_busy_sync_port_fails_the_start_naming_the_field() -> None:
    (port,) = sync_ports(1)
    async with backends_running("b0") as backends:
        doc = stub_doc(backends, sync_section("one", port, []), "random")
        async with gateway_running(parse_gateway_config(doc)):
            with pytest.raises(ConfigError, match=r"spec\.replicaSync\.listen") as raised:
                async with gateway_running(parse_gateway_config(doc)):
                    pass
    assert str(raised.value).count(str(port)) == 1  # not again in pyzmq's "(addr=...)"
