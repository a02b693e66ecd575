"""Replica sync's recovery paths (issue 22): a starting replica catches up once from a running
peer and skips a batch of the answer that does not decode; catch-up answers past their budget
are dropped; a peer forgotten and heard again counts its open requests again, while its notes
relayed by others do not revive it; a variant removed by a reload detaches its view."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import zmq
import zmq.asyncio
from gateway_support import backends_running, gateway_running
from prometheus_client import CollectorRegistry
from replica_sync_support import endpoint, stub_doc, sync_ports, sync_section

from support.waiting import wait_until
from warmfleet.api.replica_sync import BatchEncoder
from warmfleet.core.types import Decision, FleetSnapshot, InstanceId, Reason, RoutingKey
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.replica_sync.config import ReplicaSyncConfig, catch_up_endpoint
from warmfleet.gateway.replica_sync.router import CurrentRouter, Detached
from warmfleet.gateway.replica_sync.service import ReplicaSync
from warmfleet.gateway.replica_sync.transport import (
    ANSWERS_BURST,
    LOG_REQUEST,
    AnswerBudget,
    batch_message,
)
from warmfleet.routing.replica_notes import RoutedNote, finished_note, routed_note
from warmfleet.routing.replicas import ReplicaView

IDS = ("a", "b", "c")
KEY = RoutingKey((1, 2), 16, 32, 32, 1, 10, 7, None)


class Learner:
    """Strategy double: the routings it learnt."""

    name = "learner"
    reads_block_hashes = True

    def __init__(self) -> None:
        self.routed: list[Decision] = []

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        raise AssertionError("not routed here")

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        self.routed.append(decision)

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        pass


def _view(sync: ReplicaSync, variant: str) -> tuple[ReplicaView, Learner]:
    learner = Learner()
    view = sync.views[variant] = ReplicaView(sync.origin, variant, learner)
    view.on_instances_changed(IDS)
    return view, learner


def _notes(origin: str, variant: str, count: int) -> list[RoutedNote]:
    return [
        routed_note(origin, variant, n + 1, KEY, Decision(IDS[n % 3], Reason.PREFIX_HIT))
        for n in range(count)
    ]


def _config(name: str, port: int, peers: list[int]) -> ReplicaSyncConfig:
    return ReplicaSyncConfig.model_validate(sync_section(name, port, peers))


def _dropped(sync: ReplicaSync, reason: str) -> float:
    return float(sync.metrics.dropped.labels(reason)._value.get())


async def test_a_starting_replica_catches_up_once_and_skips_a_bad_batch() -> None:
    """A running peer's first batch heard is never its first (a resync is due) and the start's
    catch-up covers it: the log is fetched once; its undecodable batch is counted and skipped,
    the others applied."""
    port_a, port_b = sync_ports(2)
    a = ReplicaSync(_config("a", port_a, []), CollectorRegistry())
    a.open()
    notes = _notes(a.origin, "e/v", 100)
    a._log.add(BatchEncoder().encode(notes[:60]))
    a._log.add(b"\xc1 not a batch")
    a._log.add(BatchEncoder().encode(notes[60:]))
    b = ReplicaSync(_config("b", port_b, [port_a]), CollectorRegistry())
    b.open()
    _, learner = _view(b, "e/v")
    async with asyncio.TaskGroup() as tasks:
        run_a = tasks.create_task(a.run())
        await asyncio.sleep(0.3)  # a sends heartbeats: b's first one heard is not a's first
        run_b = tasks.create_task(b.run())
        await wait_until(lambda: b.caught_up, timeout_s=10.0)
        await asyncio.sleep(0.5)  # a second catch-up, if one were started, would be done
        assert b.metrics.catch_up_notes._value.get() == 100
        assert _dropped(b, "catch_up_bad_frame") == 1
        assert len(learner.routed) == 100
        run_a.cancel()
        run_b.cancel()


def test_the_answer_budget_allows_a_burst_then_a_rate() -> None:
    now = [0.0]
    budget = AnswerBudget(lambda: now[0], burst=3, per_s=2.0)
    assert [budget.take() for _ in range(4)] == [True, True, True, False]
    now[0] = 0.4  # 0.8 of an answer refilled
    assert budget.take() is False
    now[0] = 0.5
    assert budget.take() is True
    now[0] = 100.0  # refilled to the burst, no more
    assert [budget.take() for _ in range(4)] == [True, True, True, False]


async def test_a_flood_of_catch_up_requests_is_answered_within_the_budget() -> None:
    """Each request from its own connection (a ROUTER also drops answers past a connection's
    high-water mark): those past the budget get no answer and are counted."""
    (port,) = sync_ports(1)
    sync = ReplicaSync(_config("a", port, []), CollectorRegistry())
    sync.open()
    ctx = zmq.asyncio.Context()
    requests = ANSWERS_BURST + 8
    dealers = [ctx.socket(zmq.DEALER) for _ in range(requests)]

    async def ask(dealer: zmq.asyncio.Socket) -> bool:
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(catch_up_endpoint(endpoint(port)))
        await dealer.send_multipart([LOG_REQUEST])
        try:
            await asyncio.wait_for(dealer.recv_multipart(), 2.0)
        except TimeoutError:
            return False
        return True

    try:
        async with asyncio.TaskGroup() as tasks:
            run = tasks.create_task(sync.run())
            answered = sum(await asyncio.gather(*(ask(d) for d in dealers)))
            # the budget refills at a few a second: the others were dropped, and counted
            assert ANSWERS_BURST <= answered < requests
            assert answered + _dropped(sync, "catch_up_limited") == requests
            run.cancel()
    finally:
        for dealer in dealers:
            dealer.close(linger=0)
        ctx.term()


async def test_a_peer_heard_again_counts_its_open_requests_again() -> None:
    """Forgotten after ``peer_timeout_s`` of silence: a peer's notes relayed through another's
    log count nothing; once its own batch is heard, its requests still open count again."""
    now = [0.0]
    config = ReplicaSyncConfig(replica_id="b", heartbeat_interval_s=0.01, peer_timeout_s=1.0)
    sync = ReplicaSync(config, CollectorRegistry(), clock=lambda: now[0], wall=lambda: now[0])
    view, _ = _view(sync, "v")
    notes = _notes("p#1", "v", 4)
    sync.receive(batch_message("p#1", 0.0, 1, BatchEncoder().encode(notes[:3])))
    assert sum(view.in_flight_requests.values()) == 3
    ticker = asyncio.create_task(sync._ticker())
    now[0] = 2.0  # silent past peer_timeout_s
    await wait_until(lambda: "p#1" in sync._gone, timeout_s=5.0)
    assert sum(view.in_flight_requests.values()) == 0
    sync.apply(notes)  # another peer's log replayed: p's notes, one never seen before
    assert sum(view.in_flight_requests.values()) == 0
    # p heard again: a batch of its own, then its catch-up answer's open requests
    sync.receive(batch_message("p#1", 0.0, 2, BatchEncoder().encode([finished_note(notes[1])])))
    sync.apply([notes[0], notes[2], notes[3]])
    assert sum(view.in_flight_requests.values()) == 3  # 1, 3 and 4 are still open
    sync.apply([finished_note(n) for n in (notes[0], notes[2], notes[3])])
    assert sum(view.in_flight_requests.values()) == 0
    ticker.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await ticker


async def test_a_variant_removed_by_a_reload_detaches_its_view() -> None:
    (port,) = sync_ports(1)
    async with backends_running("b0", "b1") as backends:
        doc = stub_doc(backends, sync_section("a", port, []), "prefix_affinity")
        async with gateway_running(parse_gateway_config(doc)) as app:
            sync = app.gateway.replica_sync
            assert sync is not None
            assert isinstance(sync.views["main/v1"].strategy, CurrentRouter)
            doc["spec"]["endpoints"][0]["variants"][0]["name"] = "v2"
            app.gateway.apply(parse_gateway_config(doc), "test")
            old, new = sync.views["main/v1"], sync.views["main/v2"]
            assert isinstance(old.strategy, Detached)  # the old router is let go
            assert isinstance(new.strategy, CurrentRouter)
            note = routed_note("p#1", "main/v1", 1, KEY, Decision("b0", Reason.PREFIX_HIT))
            assert old.apply(note) is True  # counted (its end balances), learnt by no one
            assert old.apply(finished_note(note)) is True
            assert sum(old.in_flight_requests.values()) == 0
