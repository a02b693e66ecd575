"""KV-cache events: vLLM's ZMQ wire format, hashes matching the prompts, eviction."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgpack
import pytest
import zmq
import zmq.asyncio
from emulator_support import BLOCK, chat_body, chat_ids, fast_spec, post_json, words

from warmfleet.emulator.fleet import EmulatedFleet
from warmfleet.emulator.tokenizer import prompt_block_hashes


@pytest.fixture
async def subscriber() -> AsyncIterator[tuple[zmq.asyncio.Socket, int]]:
    context = zmq.asyncio.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield sub, port
    finally:
        sub.close(linger=0)
        context.term()


async def _drain(sub: zmq.asyncio.Socket, wait_ms: int) -> list[list[bytes]]:
    out: list[list[bytes]] = []
    while await sub.poll(wait_ms):
        out.append(await sub.recv_multipart())
        wait_ms = 50
    return out


def _events(frames: list[list[bytes]], topic: bytes) -> list[list[Any]]:
    events: list[list[Any]] = []
    seqs = []
    for message in frames:
        assert len(message) == 3
        assert len(message[1]) == 8
        if message[0] != topic:
            continue
        seqs.append(int.from_bytes(message[1], "big"))
        batch = msgpack.unpackb(message[2])
        ts, _, data_parallel_rank = batch  # vLLM 0.10+: [ts, events, data_parallel_rank]
        assert isinstance(ts, float)
        assert data_parallel_rank == 0
        events.extend(batch[1])
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs  # no gaps once joined
    return events


async def test_block_stored_and_removed_match_the_prompts(
    subscriber: tuple[zmq.asyncio.Socket, int],
) -> None:
    sub, port = subscriber
    spec = fast_spec(
        instances=2,
        kv_capacity_tokens=14 * BLOCK,
        kv_events={"endpoint": f"tcp://127.0.0.1:{port}"},
    )
    async with EmulatedFleet(spec) as fleet, aiohttp.ClientSession() as session:
        url = fleet.urls[0]
        for attempt in range(60):  # PUB drops events until the subscription has propagated
            await post_json(session, url, chat_body(f"warm {attempt} " + words(attempt, 40), "q"))
            if await _drain(sub, 100):
                break
        else:
            pytest.fail("no KV event ever arrived")
        await _drain(sub, 200)
        first = chat_body("alpha " + words(100, 150), "q", max_tokens=2)
        await post_json(session, url, first)
        await post_json(session, url, chat_body("beta " + words(101, 150), "q", max_tokens=2))
        await post_json(session, fleet.urls[1], chat_body("gamma", "q"))
        frames = await _drain(sub, 500)
    events = _events(frames, b"kv.emu-0")
    ids = chat_ids(first)
    expected = prompt_block_hashes(ids, BLOCK, 0)
    stored = [e for e in events if e[0] == "BlockStored"]
    first_event = next(e for e in stored if e[1][0] == expected[0])
    hashes = [h for e in stored for h in e[1] if h in set(expected)]
    assert hashes == list(expected)
    assert first_event[2] is None  # root block: no parent
    assert first_event[4] == BLOCK
    assert first_event[3][: len(first_event[1]) * BLOCK] == ids[: len(first_event[1]) * BLOCK]
    removed = {h for e in events if e[0] == "BlockRemoved" for h in e[1]}
    assert removed & set(expected)  # beta needed the space: alpha's blocks were evicted
    assert any(message[0] == b"kv.emu-1" for message in frames)


async def test_events_decode_with_the_gateway_subscriber(
    subscriber: tuple[zmq.asyncio.Socket, int],
) -> None:
    kv = pytest.importorskip("warmfleet.gateway.kv_events")
    sub, port = subscriber
    spec = fast_spec(kv_events={"endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv.a{index}"})
    async with EmulatedFleet(spec) as fleet, aiohttp.ClientSession() as session:
        frames: list[list[bytes]] = []
        for attempt in range(60):
            await post_json(
                session, fleet.urls[0], chat_body(f"p{attempt} " + words(attempt, 40), "q")
            )
            frames = await _drain(sub, 100)
            if frames:
                break
    assert frames
    topic, _seq, batch = kv.decode_frames(frames[0])
    assert topic == "kv.a0"
    assert batch.events


async def test_a_late_subscriber_recovers_the_history_by_replay() -> None:
    """``replay_port_offset``: as vLLM's ``replay_endpoint``, the instance keeps its batches and
    resends them, so the gateway's subscriber, started after the instance published, ends up
    with every block of the prompts it never saw."""
    kv = pytest.importorskip("warmfleet.gateway.kv_events")
    from warmfleet.bench.live_fleet import consecutive_free_ports  # noqa: PLC0415
    from warmfleet.bench.live_procs import free_port  # noqa: PLC0415
    from warmfleet.gateway.kv_events.transport import ReplaySource  # noqa: PLC0415
    from warmfleet.routing.exact_index import ExactPrefixIndex  # noqa: PLC0415

    events = f"tcp://127.0.0.1:{free_port()}"
    base = consecutive_free_ports(2)
    spec = fast_spec(base_port=base, kv_events={"endpoint": events, "replay_port_offset": 1})
    index = ExactPrefixIndex()
    translator = kv.KvEventTranslator(index, 99, BLOCK, replay=True)
    before = [chat_body(f"early {i} " + words(200 + i, 60), "q") for i in range(3)]
    async with EmulatedFleet(spec) as fleet, aiohttp.ClientSession() as session:
        for body in before:  # published to nobody: no subscriber yet
            await post_json(session, fleet.urls[0], body)
        sub = kv.KvEventSubscriber(
            translator,
            events,
            poll_interval_s=0.05,
            replay=ReplaySource(lambda _iid: f"tcp://127.0.0.1:{base + 1}", 2.0),
        )
        task = asyncio.create_task(sub.run())
        try:
            for attempt in range(100):
                await post_json(session, fleet.urls[0], chat_body(f"late {attempt}", "q"))
                await asyncio.sleep(0.05)
                if translator.stats.replays_recovered:
                    break
            else:
                pytest.fail(f"no replay recovered: {translator.describe()}")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert translator.stats.late_joins == 0
    assert translator.mode("emu-0") == "exact"
    for body in before:
        ids = chat_ids(body)
        matched = index.match(kv.router_block_hashes(ids, BLOCK, 99)).get("emu-0", 0)
        assert matched >= len(ids) // BLOCK - 1 > 0
