"""Gap recovery by replay: the translator holds an instance's batches while the engine replays
what was missed (vLLM's ``replay_endpoint``), and the subscriber speaks vLLM's replay protocol
to a publisher laid out like vLLM's ``ZmqEventPublisher`` (PUB + ROUTER with a buffer)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterator, Sequence

import pytest
import zmq
import zmq.asyncio
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_e2e_kv_events import BS, SEED, batch, block, vllm_frame

from warmfleet.api.kv_events import END_SEQ
from warmfleet.bench.live_procs import free_port
from warmfleet.gateway.kv_config import KvReplayConfig
from warmfleet.gateway.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEventSubscriber,
    KvEventTranslator,
    router_block_hashes,
)
from warmfleet.gateway.kv_events.transport import ReplaySource
from warmfleet.gateway.kv_events.view import ReplayRequest
from warmfleet.routing.exact_index import ExactPrefixIndex


def make() -> tuple[ExactPrefixIndex, KvEventTranslator]:
    index = ExactPrefixIndex()
    translator = KvEventTranslator(index, SEED, BS, resync_batches=2, replay=True)
    return index, translator


def replayed(
    tr: KvEventTranslator,
    request: ReplayRequest,
    batches: Sequence[tuple[int, EventBatch]] | None,
    now_s: float,
) -> None:
    """An answer applied all at once (the subscriber applies it a slice at a time)."""
    for _step in tr.replay_steps(request, batches, now_s):
        pass


def chain(blocks: int) -> list[int]:
    return router_block_hashes(list(range(blocks * BS)), BS, SEED)


def test_a_replayed_gap_keeps_the_instance_exact() -> None:
    index, tr = make()
    tr.apply("a", 0, batch(block((1,), None, range(4))), 0.0)
    missed = batch(block((2,), 1, range(4, 8)))
    tr.apply("a", 2, batch(block((3,), 2, range(8, 12))), 1.0)  # batch 1 lost
    tr.apply("a", 3, batch(block((4,), 3, range(12, 16))), 1.0)  # held meanwhile
    (request,) = tr.take_replay_requests()
    assert (request.instance_id, request.from_seq) == ("a", 1)
    assert index.match(chain(4)) == {"a": 1}  # still exact, just behind
    replayed(tr, request, [(0, batch()), (1, missed), (2, batch()), (3, batch())], 1.5)
    assert tr.mode("a") == "exact"
    assert index.match(chain(4)) == {"a": 4}  # nothing missing: no hit goes unseen
    assert (tr.stats.gaps, tr.stats.replays, tr.stats.replays_recovered) == (0, 1, 1)
    assert tr.take_replay_requests() == []


def test_an_unanswered_replay_falls_back_as_before() -> None:
    index, tr = make()
    tr.apply("a", 0, batch(block((1,), None, range(4))), 0.0)
    tr.apply("a", 5, batch(block((6,), None, range(20, 24))), 1.0)
    tr.apply("a", 6, batch(block((7,), 6, range(24, 28))), 1.0)
    (request,) = tr.take_replay_requests()
    replayed(tr, request, [(4, batch())], 2.0)  # batches 1-3 are no longer in its buffer
    assert tr.mode("a") == "exact"  # resynced on the two clean batches held meanwhile
    assert (tr.stats.gaps, tr.stats.replays_recovered) == (1, 0)
    assert tr.take_replay_requests() == []  # the failed gap is not asked for again
    # what was known before the gap is no longer claimed; the held batches are
    assert index.match(chain(1)) == {}
    assert index.match(router_block_hashes(list(range(20, 28)), BS, SEED)) == {"a": 2}
    tr2_index, tr2 = make()
    tr2.apply("a", 0, batch(), 0.0)
    tr2.apply("a", 3, batch(), 0.0)
    (request,) = tr2.take_replay_requests()
    replayed(tr2, request, None, 1.0)
    assert tr2.mode("a") == "approximate"
    assert not tr2_index.knows("a")


def test_a_late_join_is_replayed_from_the_first_batch() -> None:
    index, tr = make()
    tr.apply("a", 2, batch(block((3,), 2, range(8, 12))), 0.0)
    (request,) = tr.take_replay_requests()
    assert request.from_seq == 0
    history = [
        (0, batch(AllBlocksCleared(), block((1,), None, range(4)))),
        (1, batch(block((2,), 1, range(4, 8)))),
    ]
    replayed(tr, request, history, 0.5)
    assert tr.mode("a") == "exact"
    assert index.match(chain(3)) == {"a": 3}
    assert tr.stats.late_joins == 0


def test_a_restart_while_waiting_drops_the_replay() -> None:
    index, tr = make()
    tr.apply("a", 0, batch(block((1,), None, range(4))), 0.0)
    tr.apply("a", 3, batch(), 0.0)
    (stale,) = tr.take_replay_requests()
    tr.apply("a", 0, batch(block((9,), None, range(40, 44))), 0.0)  # restarted meanwhile
    replayed(tr, stale, [(1, batch(block((2,), 1, range(4, 8)))), (2, batch())], 0.5)
    assert tr.mode("a") == "exact"
    assert index.match(chain(2)) == {}  # the old incarnation's blocks are gone
    assert index.match(router_block_hashes(list(range(40, 44)), BS, SEED)) == {"a": 1}
    tr.apply("a", 2, batch(), 1.0)  # a new gap: a new request; the stale answer stays stale
    (fresh,) = tr.take_replay_requests()
    replayed(tr, stale, [(1, batch())], 1.0)
    assert tr.mode("a") == "exact"
    assert fresh.serial != stale.serial


@pytest.mark.parametrize(
    ("config", "url", "endpoint"),
    [
        ({"port": 5558}, "http://10.0.0.7:8000", "tcp://10.0.0.7:5558"),
        ({"port_offset": 1000}, "http://127.0.0.1:8001", "tcp://127.0.0.1:9001"),
        ({"port_offset": 1}, "https://[fd00::1]/v1", "tcp://[fd00::1]:444"),
        ({"port_offset": 1}, "http://127.0.0.1:65535", None),
    ],
)
def test_replay_endpoint_of_an_instance(config: dict[str, int], url: str, endpoint: str) -> None:
    assert KvReplayConfig.model_validate(config).endpoint(url) == endpoint


def test_replay_config_needs_exactly_one_port() -> None:
    for bad in ({}, {"port": 1, "port_offset": 1}):
        with pytest.raises(ValueError, match="exactly one of port and portOffset"):
            KvReplayConfig.model_validate(bad)


class VllmLikePublisher:
    """PUB (connects, as vLLM does with a concrete host) + ROUTER replay with a buffer of
    (seq, payload), answering as vLLM's ``ZmqEventPublisher._service_replay`` does."""

    def __init__(self, ctx: zmq.asyncio.Context, events: str, replay: str, topic: str) -> None:
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.connect(events)
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(replay)
        self.topic = topic
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=10)
        self.seq = 0
        self.replays = 0

    async def publish(self, events: list[dict[str, object]], *, drop: bool = False) -> None:
        frames = vllm_frame(self.seq, events, self.topic)
        self.buffer.append((self.seq, frames[2]))
        if not drop:  # a batch lost on the way (HWM, a slow subscriber)
            await self.pub.send_multipart(frames)
        self.seq += 1

    async def serve_replays(self) -> None:
        while True:
            client, empty, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            self.replays += 1
            for seq, payload in self.buffer:
                if seq >= first:
                    frames = [client, empty, self.topic.encode(), seq.to_bytes(8, "big"), payload]
                    await self.router.send_multipart(frames)
            await self.router.send_multipart([client, b"", b"", END_SEQ, b""])

    def close(self) -> None:
        self.pub.close(linger=0)
        self.router.close(linger=0)


def stored_event(hashes: list[int], parent: int | None, start: int) -> dict[str, object]:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": list(range(start, start + BS * len(hashes))),
        "block_size": BS,
        "lora_id": None,
        "medium": "GPU",
    }


async def test_subscriber_recovers_a_lost_batch_by_replay() -> None:
    events = f"tcp://127.0.0.1:{free_port()}"
    replay_port = free_port()
    index, tr = make()
    config = KvReplayConfig(port=replay_port, timeout_s=2.0)
    sub = KvEventSubscriber(
        tr,
        events,
        poll_interval_s=0.05,
        replay=ReplaySource(lambda _iid: config.endpoint("http://127.0.0.1:8000"), 2.0),
    )
    ctx = zmq.asyncio.Context()
    engine = VllmLikePublisher(ctx, events, f"tcp://127.0.0.1:{replay_port}", "kv.vllm-0")
    tasks = [asyncio.create_task(sub.run()), asyncio.create_task(engine.serve_replays())]
    loop = asyncio.get_running_loop()
    try:
        deadline = loop.time() + 20
        while not tr.stats.batches:  # the SUB must be subscribed before the story starts
            assert loop.time() < deadline, "no batch arrived"
            engine.seq = 0
            engine.buffer.clear()
            await engine.publish([{"type": "AllBlocksCleared"}])
            await asyncio.sleep(0.05)
        await engine.publish([stored_event([1], None, 0)])
        await engine.publish([stored_event([2], 1, BS)], drop=True)
        await engine.publish([stored_event([3], 2, 2 * BS)])
        while tr.stats.replays_recovered < 1:
            assert loop.time() < deadline, "the replay did not recover the gap"
            await asyncio.sleep(0.02)
        assert tr.mode("vllm-0") == "exact"
        assert index.match(chain(3)) == {"vllm-0": 3}
        assert (tr.stats.gaps, engine.replays) == (0, 1)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        engine.close()
        ctx.term()


async def test_subscriber_without_an_answer_falls_back() -> None:
    """No replay socket listens: the request times out and the gap is handled as one."""
    events = f"tcp://127.0.0.1:{free_port()}"
    index, tr = make()
    dead = f"tcp://127.0.0.1:{free_port()}"
    sub = KvEventSubscriber(
        tr, events, poll_interval_s=0.05, replay=ReplaySource(lambda _iid: dead, 0.3)
    )
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(events)
    task = asyncio.create_task(sub.run())
    loop = asyncio.get_running_loop()
    try:
        deadline = loop.time() + 20
        while not tr.stats.batches:
            assert loop.time() < deadline, "no batch arrived"
            await pub.send_multipart(vllm_frame(0, [{"type": "AllBlocksCleared"}]))
            await asyncio.sleep(0.05)
        await pub.send_multipart(vllm_frame(5, []))
        while tr.stats.gaps < 1:
            assert loop.time() < deadline, "the gap was never handled"
            await asyncio.sleep(0.02)
        assert (tr.stats.replays, tr.stats.replays_recovered) == (1, 0)
        assert tr.mode("vllm-0") == "approximate"
        assert not index.knows("vllm-0")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        pub.close(linger=0)
        ctx.term()


@example(ops=[(0, 1, False)] * 8, dropped={1, 3}, answer_after=3)  # a gap while waiting
@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(1, 3), st.booleans()), max_size=25),
    st.sets(st.integers(0, 24)),
    st.integers(0, 3),
)
def test_replayed_gaps_leave_the_same_index_as_no_gaps(
    ops: list[tuple[int, int, bool]], dropped: set[int], answer_after: int
) -> None:
    """Whatever batches are lost (but the last), if every replay is answered from the
    engine's buffer the exact index ends exactly as if none had been lost (answers may come
    several batches later)."""
    history: list[EventBatch] = []
    chains: dict[int, list[int]] = {}
    for root, length, remove in ops:
        chain = chains.setdefault(root, [])
        if remove and chain:
            history.append(batch(BlockRemoved((chain.pop(),))))
            continue
        start = root * 1000 + len(chain) * BS
        hashes = tuple(hash((root, len(chain) + i)) & 0xFFFFFFFF for i in range(length))
        parent = chain[-1] if chain else None
        tokens = tuple(range(start, start + length * BS))
        history.append(batch(BlockStored(hashes, parent, tokens, BS)))
        chain.extend(hashes)
    dropped.discard(len(history) - 1)  # a loss shows once a later batch arrives
    reference, ref_tr = make()
    for seq, b in enumerate(history):
        ref_tr.apply("a", seq, b, 0.0)
    index, tr = make()
    pending = []
    for seq, b in enumerate(history):
        if seq not in dropped:
            tr.apply("a", seq, b, 0.0)
        pending += [(r, seq + answer_after) for r in tr.take_replay_requests()]
        for request, due in [p for p in pending if p[1] <= seq]:
            pending.remove((request, due))
            replayed(tr, request, list(enumerate(history))[request.from_seq : seq + 1], 0.0)
    # the rest of the answers come after the last batch (one may lead to another request)
    pending += [(r, 0) for r in tr.take_replay_requests()]
    while pending:
        request, _due = pending.pop(0)
        replayed(tr, request, list(enumerate(history))[request.from_seq :], 0.0)
        pending += [(r, 0) for r in tr.take_replay_requests()]
    assert tr.stats.gaps == 0
    runs = sum(1 for d in dropped if d - 1 not in dropped and d < len(history))
    assert tr.stats.replays <= runs  # one per run of lost batches, none for held ones
    assert tr.mode("a") == ref_tr.mode("a")
    assert index.distinct_blocks == reference.distinct_blocks
    for root in chains:
        longest = router_block_hashes(list(range(root * 1000, root * 1000 + 80 * BS)), BS, SEED)
        assert index.match(longest) == reference.match(longest)


def test_batches_arriving_while_a_replay_is_applied_queue_behind_it() -> None:
    """The subscriber applies a replay a slice at a time; what arrives meanwhile waits its turn
    (a gap among it is asked for again), a restart ends the replay."""
    index, tr = make()
    tr.apply("a", 0, batch(block((1,), None, range(4))), 0.0)
    tr.apply("a", 3, batch(block((4,), 3, range(12, 16))), 0.0)
    (request,) = tr.take_replay_requests()
    answer = [(1, batch(block((2,), 1, range(4, 8)))), (2, batch(block((3,), 2, range(8, 12))))]
    steps = tr.replay_steps(request, answer, 0.0)
    next(steps)  # batch 1 applied
    tr.apply("a", 4, batch(block((5,), 4, range(16, 20))), 0.0)  # arrives mid-replay
    tr.apply("a", 6, batch(), 0.0)  # and a new gap behind it
    assert list(steps) == [None] * 4  # batches 2, 3 and 4 applied; 6 asks for 5
    assert index.match(chain(5)) == {"a": 5}
    (again,) = tr.take_replay_requests()
    assert again.from_seq == 5
    replayed(tr, again, [(5, batch())], 0.0)
    assert (tr.stats.gaps, tr.stats.replays_recovered) == (0, 2)
    assert tr.describe()["instances"]["a"]["last_seq"] == 6

    tr.apply("a", 9, batch(), 0.0)
    (third,) = tr.take_replay_requests()
    late = batch(block((9,), None, range(90, 94)))
    steps = tr.replay_steps(third, [(7, batch()), (8, late)], 0.0)
    next(steps)
    tr.apply("a", 0, batch(), 0.0)  # the engine restarted: the rest of the replay is moot
    assert list(steps) == []
    assert index.match(router_block_hashes(list(range(90, 94)), BS, SEED)) == {}
    assert tr.describe()["instances"]["a"]["last_seq"] == 0


async def test_a_replay_cancelled_half_way_is_finished() -> None:
    """The subscriber yields to the loop every 64 batches; cancelled meanwhile (the gateway
    stops) it still applies the rest, so no instance is left holding batches forever."""
    applied: list[int] = []

    class Consumer:
        def replay_steps(self, *_args: object) -> Iterator[None]:
            for i in range(200):
                applied.append(i)
                yield

    _index, tr = make()
    sub = KvEventSubscriber(tr, f"tcp://127.0.0.1:{free_port()}")
    sub.consumer = Consumer()  # type: ignore[assignment]
    try:
        task = asyncio.create_task(sub._replay(ReplayRequest("a", 1, 1)))
        while len(applied) < 64:
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert len(applied) == 200
    finally:
        sub.close()
