"""When a replica's notes leave: at the loop's next turn for a quiet replica, for the end of
its last open request or for an end whose routing has not left yet, else batched until
``batch_interval_ms`` after the last batch; a request's end before the client has its last
bytes (so a client's next request, to any replica, never finds the previous one still in
flight there for want of a batch)."""

from __future__ import annotations

import asyncio

import aiohttp
from gateway_support import MODEL, backends_running, gateway_running
from prometheus_client import CollectorRegistry
from replica_sync_support import stub_doc, sync_ports, sync_section

from support.waiting import wait_until
from warmfleet.api.replica_sync import BatchEncoder
from warmfleet.core.types import Decision, Reason, RoutingKey
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.replica_sync.config import ReplicaSyncConfig
from warmfleet.gateway.replica_sync.service import ReplicaSync
from warmfleet.gateway.replica_sync.transport import HEADER
from warmfleet.gateway.server import StartedApp
from warmfleet.routing.replica_notes import RoutedNote, finished_note, routed_note


def _batches(sync: ReplicaSync) -> float:
    return float(sync.metrics.batches.value)


def _routed(sync: ReplicaSync, seq: int) -> RoutedNote:
    key = RoutingKey((seq,), 16, 16, 16, seq)
    return routed_note(sync.origin, "e/v", seq, key, Decision("i0", Reason.NO_MATCH))


def _opened(now_s: list[float]) -> ReplicaSync:
    """A replica with no peers, 10 ms batches, its clock ``now_s[0]``, on this event loop."""
    (port,) = sync_ports(1)
    config = ReplicaSyncConfig.model_validate(sync_section("r", port, [], batch_interval_ms=10.0))
    sync = ReplicaSync(config, CollectorRegistry(), clock=lambda: now_s[0])
    sync.open()
    sync._loop = asyncio.get_running_loop()  # as ``run`` sets it
    return sync


async def test_a_quiet_replica_sends_at_its_next_turn_and_a_busy_one_batches() -> None:
    now_s = [100.0]
    sync = _opened(now_s)
    try:
        first = _routed(sync, 1)
        sync.send(first)
        assert (len(sync._pending), _batches(sync)) == (1, 0.0)  # not inside the caller
        await asyncio.sleep(0)
        assert (sync._pending, _batches(sync)) == ([], 1.0)  # quiet: no batching delay
        sent = HEADER.size + len(sync.origin.encode()) + len(BatchEncoder().encode([first]))
        assert sync.metrics.bytes_sent.value == sent
        now_s[0] += 0.001
        sync.send(_routed(sync, 2))
        sync.send(_routed(sync, 3))
        sync.send(finished_note(first))  # two requests still open: no hurry
        await asyncio.sleep(0.001)
        assert (len(sync._pending), _batches(sync)) == (3, 1.0)  # within 10 ms of the last
        now_s[0] += 0.010  # the timer fires by the loop's clock, its wait is up by this one
        await wait_until(lambda: not sync._pending, timeout_s=5.0)
        assert _batches(sync) == 2.0  # the three queued notes left as one batch
        now_s[0] += 0.001
        sync.send(finished_note(_routed(sync, 2)))
        await asyncio.sleep(0)
        assert (len(sync._pending), _batches(sync)) == (1, 2.0)  # request 3 is still open
        sync.send(finished_note(_routed(sync, 3)))  # the last open request ended
        await asyncio.sleep(0)
        assert (sync._pending, _batches(sync)) == ([], 3.0)  # within 10 ms, yet at once
        assert sync._timer is None  # no wake-up left for an idle loop
    finally:
        sync.close()


async def test_an_end_whose_routing_is_still_queued_takes_the_batch_along_at_once() -> None:
    now_s = [100.0]
    sync = _opened(now_s)
    try:
        sync.send(_routed(sync, 1))
        await asyncio.sleep(0)
        assert _batches(sync) == 1.0
        now_s[0] += 0.001  # busy: the next notes wait for the batch
        second, third = _routed(sync, 2), _routed(sync, 3)
        sync.send(second)
        sync.send(third)
        await asyncio.sleep(0)
        assert (len(sync._pending), _batches(sync)) == (2, 1.0)
        # a short request ends before its routing left: its client may send its next turn to
        # a peer at once, so the routing (with everything queued) leaves now
        sync.send(finished_note(second))
        assert len(sync._pending) == 3  # not inside the caller
        await asyncio.sleep(0)
        assert (sync._pending, _batches(sync)) == ([], 2.0)
        now_s[0] += 0.001
        sync.send(_routed(sync, 4))  # request 1, 3 and 4 are open; 3's routing has left
        sync.send(finished_note(third))
        await asyncio.sleep(0)
        assert (len(sync._pending), _batches(sync)) == (2, 2.0)
    finally:
        sync.close()


async def test_a_batch_sent_at_once_moves_the_next_batch_on() -> None:
    now_s = [100.0]
    sync = _opened(now_s)
    try:
        sync.send(_routed(sync, 1))
        await asyncio.sleep(0)
        now_s[0] += 0.001
        second = _routed(sync, 2)
        sync.send(second)  # a timer for 10 ms after batch 1
        await asyncio.sleep(0)
        sync.send(finished_note(second))  # a short request: its routing leaves at once
        await asyncio.sleep(0)
        assert _batches(sync) == 2.0
        sync.send(_routed(sync, 3))
        await asyncio.sleep(0.015)  # its timer fired (by the loop's clock)
        # but by this clock batch 2 left 0 ms ago: the next waits for 10 ms after it
        assert (len(sync._pending), _batches(sync)) == (1, 2.0)
        now_s[0] += 0.010
        await wait_until(lambda: not sync._pending, timeout_s=5.0)
        assert _batches(sync) == 3.0
    finally:
        sync.close()


async def test_notes_queued_before_the_loop_ran_leave_once_it_runs() -> None:
    now_s = [100.0]
    sync = _opened(now_s)
    sync._loop = None  # before ``run``: no timer can be armed
    sync.send(_routed(sync, 1))  # quiet: sent inside the caller, there is no loop turn to wait
    now_s[0] += 0.001
    sync.send(_routed(sync, 2))
    assert (len(sync._pending), _batches(sync), sync._timer) == (1, 1.0, None)
    task = asyncio.create_task(sync.run())
    try:
        await wait_until(lambda: not sync._pending, timeout_s=5.0)
        assert _batches(sync) == 2.0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _open_notes(app: StartedApp) -> dict[str, dict[str, int]]:
    sync = app.gateway.replica_sync
    assert sync is not None
    return {k: dict(v.open_requests()) for k, v in sync.views.items()}


async def test_a_requests_end_leaves_before_the_client_has_its_last_bytes() -> None:
    port_a, port_b = sync_ports(2)
    async with backends_running("b0") as backends:
        backends[0].gate = asyncio.Event()
        doc_a = stub_doc(backends, sync_section("a", port_a, [port_b]), "prefix_affinity")
        doc_b = stub_doc(backends, sync_section("b", port_b, [port_a]), "prefix_affinity")
        async with (
            gateway_running(parse_gateway_config(doc_a)) as a,
            gateway_running(parse_gateway_config(doc_b)) as b,
            aiohttp.ClientSession() as session,
        ):
            sync_a = a.gateway.replica_sync
            assert sync_a is not None
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
            async with session.post(a.url + "/v1/chat/completions", json=body) as resp:
                await asyncio.sleep(0.05)  # the routed note left long before the end
                assert sync_a._own_open
                backends[0].gate.set()
                await resp.read()
                # the client has the whole answer: the end is already on the wire
                assert not sync_a._own_open
                assert not sync_a._pending
            origin_a = sync_a.origin
            await wait_until(
                lambda: all(not v.get(origin_a) for v in _open_notes(b).values()), timeout_s=5.0
            )
