"""The replicas' receiving side read without a future per message: every batch a peer
published is read, in order, in bursts of at most ``RECEIVE_BURST``; the service applies
batches that arrive while it sleeps on the SUB socket's descriptor, at once or
``apply_delay_ms`` later, and a decision's ``drain`` reads what waits before that."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
import uvloop
from prometheus_client import CollectorRegistry
from replica_sync_support import endpoint, sync_ports

from support.waiting import wait_until
from warmfleet.api.replica_sync import BatchEncoder, ReplicaSyncError
from warmfleet.core.config import parse_document
from warmfleet.core.errors import ConfigError
from warmfleet.gateway.replica_sync.config import ReplicaSyncConfig
from warmfleet.gateway.replica_sync.inbound import Inbound
from warmfleet.gateway.replica_sync.service import ReplicaSync
from warmfleet.gateway.replica_sync.transport import Sockets, batch_message, parse_batch
from warmfleet.routing.replica_notes import FinishedNote


def _message(number: int) -> bytes:
    note = FinishedNote("peer#1", "e/v", number + 1, "i0", 5)
    return batch_message("peer#1", time.time(), number, BatchEncoder().encode([note]))


def _published(sender: Sockets, receiver: Sockets, count: int) -> list[int]:
    """Publish ``count`` batches until the subscription is live; the numbers read back."""
    numbers: list[int] = []
    deadline = time.monotonic() + 10
    while not numbers and time.monotonic() < deadline:  # a SUB drops what precedes its join
        sender.send(_message(0))
        time.sleep(0.02)
        numbers = [parse_batch(f).number for f in receiver.receive_ready()]
    for number in range(1, count + 1):
        sender.send(_message(number))
    while len(numbers) < count + 1 and time.monotonic() < deadline:
        time.sleep(0.01)
        numbers += [parse_batch(f).number for f in receiver.receive_ready(limit=7)]
    return [n for n in numbers if n]


def test_every_batch_is_read_in_order_in_bounded_bursts() -> None:
    port_a, port_b = sync_ports(2)
    sender, receiver = Sockets(endpoint(port_a)), Sockets(endpoint(port_b))
    try:
        receiver.set_peers([endpoint(port_a)])
        assert _published(sender, receiver, 50) == list(range(1, 51))
        assert receiver.receive_ready() == []
        for number in range(1, 11):
            sender.send(_message(number))
        deadline = time.monotonic() + 10
        read: list[int] = []
        while len(read) < 10 and time.monotonic() < deadline:
            burst = receiver.receive_ready(limit=3)
            assert len(burst) <= 3
            read += [parse_batch(m).number for m in burst]
            time.sleep(0.01)
        assert read == list(range(1, 11))
    finally:
        sender.close()
        receiver.close()


def _service(port: int, peer_port: int, apply_delay_ms: float) -> ReplicaSync:
    """Replica ``b`` listening on ``port``, subscribed to ``peer_port`` (no catch-up)."""
    peers = {"type": "static", "endpoints": [endpoint(peer_port)]}
    config = ReplicaSyncConfig.model_validate(
        {
            "replica_id": "b",
            "listen": {"port": port},
            "peers": peers,
            "apply_delay_ms": apply_delay_ms,
            "catch_up_timeout_s": 0,
        }
    )
    sync = ReplicaSync(config, CollectorRegistry())
    sync.open()
    return sync


async def _joined(
    sender: Sockets, sync: ReplicaSync, read: Callable[[], None] = lambda: None
) -> None:
    """Publish batch 0 until the service read one (a SUB drops what precedes its join);
    ``read`` after each try."""
    while "peer#1" not in sync._last_batch:
        sender.send(_message(0))
        await asyncio.sleep(0.02)
        read()


@pytest.mark.parametrize("apply_delay_ms", [0.0, 40.0])
async def test_the_service_applies_what_arrives_while_it_sleeps(apply_delay_ms: float) -> None:
    await _applies_what_arrives(apply_delay_ms)


@pytest.mark.parametrize("apply_delay_ms", [0.0, 40.0])
def test_the_service_applies_what_arrives_under_uvloop(apply_delay_ms: float) -> None:
    """The gateway's own loop (its ``remove_reader`` returns None, not the bool typeshed
    promises: compiled code that used the result failed there)."""
    uvloop.run(_applies_what_arrives(apply_delay_ms))


async def _applies_what_arrives(apply_delay_ms: float) -> None:
    port_a, port_b = sync_ports(2)
    sender = Sockets(endpoint(port_a))
    sync = _service(port_b, port_a, apply_delay_ms)
    task = asyncio.create_task(sync.run())
    try:
        await asyncio.wait_for(_joined(sender, sync), 10)
        for number in range(1, 400):
            sender.send(_message(number))
            if number % 50 == 0:
                await asyncio.sleep(0.01)  # the receiver sleeps between bursts
        await wait_until(lambda: sync._last_batch["peer#1"] == 399)
        for number in range(400, 410):
            sender.send(_message(number))
        await wait_until(lambda: sync._last_batch["peer#1"] == 409)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        sync.close()
        sender.close()


async def test_a_decision_reads_what_waits_before_the_delay_is_up() -> None:
    """With a long ``apply_delay_ms``, nothing is read on arrival; ``drain`` (a variant's
    snapshot, before each decision) reads every batch that arrived, and the timer does too."""
    port_a, port_b = sync_ports(2)
    sender = Sockets(endpoint(port_a))
    sync = _service(port_b, port_a, 1000.0)
    inbound = sync._inbound
    assert inbound is not None
    task = asyncio.create_task(sync.run())
    try:
        await asyncio.wait_for(_joined(sender, sync, inbound.drain), 10)  # a drain reads
        inbound.drain()
        last = sync._last_batch["peer#1"]
        for number in range(last + 1, last + 21):
            sender.send(_message(number))
        await wait_until(lambda: inbound.waiting)  # signalled, not read
        await asyncio.sleep(0.05)  # every batch has arrived by now (loopback)
        assert sync._last_batch["peer#1"] == last
        inbound.drain()
        assert (sync._last_batch["peer#1"], inbound.waiting) == (last + 20, False)
        sender.send(_message(last + 21))  # read by the timer, a second later
        await wait_until(lambda: inbound.waiting)
        start_s = time.monotonic()
        await wait_until(lambda: sync._last_batch["peer#1"] == last + 21, timeout_s=5.0)
        assert time.monotonic() - start_s > 0.5
        # its delay is observed to its arrival (the signal), not to the read a second later
        assert sync.metrics.recent_delays_s[-1] < 0.5, list(sync.metrics.recent_delays_s)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        sync.close()
        sender.close()


async def test_a_batch_that_raises_does_not_stop_the_reading(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug in applying one batch is logged; the batches after it, in the same read and
    later, are still read (the reader is watched again)."""
    port_a, port_b = sync_ports(2)
    sender, receiver = Sockets(endpoint(port_a)), Sockets(endpoint(port_b))
    read: list[int] = []

    def on_message(message: bytes, _arrived_s: float | None) -> None:
        number = parse_batch(message).number
        read.append(number)
        if number == 3:
            raise RuntimeError("a bug")

    inbound = Inbound(receiver, on_message, 0.0, time.time)
    inbound.start(asyncio.get_running_loop())
    try:
        receiver.set_peers([endpoint(port_a)])
        while not read:  # a SUB drops what precedes its join
            sender.send(_message(0))
            await asyncio.sleep(0.02)
        for number in range(1, 6):
            sender.send(_message(number))
        await wait_until(lambda: read[-1] == 5)
        sender.send(_message(6))
        await wait_until(lambda: read[-1] == 6)
        assert [n for n in read if n] == [1, 2, 3, 4, 5, 6]
        assert "a peer's batch was not applied" in caplog.text
    finally:
        inbound.stop()
        sender.close()
        receiver.close()


@pytest.mark.parametrize("stamp", [float("inf"), float("-inf"), float("nan")])
def test_a_batch_stamped_with_no_time_is_refused(stamp: float) -> None:
    """A -inf stamp made the propagation delay's sum +Inf for the life of the process."""
    message = batch_message("r1#ab", stamp, 1, BatchEncoder().encode([]))
    with pytest.raises(ReplicaSyncError, match="not a time"):
        parse_batch(message)


def test_one_peer_endpoint_zeromq_refuses_keeps_the_others_subscribed() -> None:
    good = endpoint(sync_ports(1)[0])
    sockets = Sockets(endpoint(sync_ports(1)[0]))
    try:
        sockets.set_peers(["tcp://_a:1", good])
        assert sockets.connected == {good}
        sockets.set_peers([good])
        assert sockets.connected == {good}
    finally:
        sockets.close()


def test_a_peer_endpoint_zeromq_would_refuse_is_refused_at_load() -> None:
    peers = {"type": "static", "endpoints": ["tcp://_a:1"]}
    with pytest.raises(ConfigError, match=r"peers\.static\.endpoints\.0"):
        parse_document(ReplicaSyncConfig, {"peers": peers}, "spec.replicaSync")
