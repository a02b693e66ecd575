"""The replicas' receiving side read without a future per message: every batch a peer
published is read, in order, in bursts of at most ``RECEIVE_BURST``, and the service applies
batches that arrive while it sleeps on the SUB socket's descriptor."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry
from replica_sync_support import endpoint, sync_ports

from support.waiting import wait_until
from warmfleet.api.replica_sync import encode_batch
from warmfleet.gateway.replica_sync.config import ReplicaSyncConfig
from warmfleet.gateway.replica_sync.service import ReplicaSync
from warmfleet.gateway.replica_sync.transport import Sockets, batch_message, parse_batch
from warmfleet.routing.replica_notes import FinishedNote


def _message(number: int) -> bytes:
    note = FinishedNote("peer#1", "e/v", number + 1, "i0", 5)
    return batch_message("peer#1", time.time(), number, encode_batch([note]))


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


async def test_the_service_applies_what_arrives_while_it_sleeps() -> None:
    port_a, port_b = sync_ports(2)
    sender = Sockets(endpoint(port_a))
    peers = {"type": "static", "endpoints": []}
    config = ReplicaSyncConfig.model_validate(
        {"replica_id": "b", "listen": {"port": port_b}, "peers": peers}
    )
    sync = ReplicaSync(config, CollectorRegistry())
    sync.open()
    sockets = sync._sockets
    assert sockets is not None
    sockets.set_peers([endpoint(port_a)])
    task = asyncio.create_task(sync._receiver())
    try:
        for number in range(1, 400):
            sender.send(_message(number))
            if number % 50 == 0:
                await asyncio.sleep(0.01)  # the receiver sleeps between bursts
        await wait_until(lambda: "peer#1" in sync._last_batch)
        start = sync._last_batch["peer#1"]
        for number in range(400, 410):
            sender.send(_message(number))
        await wait_until(lambda: sync._last_batch["peer#1"] == 409)
        assert start < 409
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        sync.close()
        sender.close()
