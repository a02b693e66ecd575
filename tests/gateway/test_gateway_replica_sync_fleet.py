"""Gateway replicas in front of the emulator with replica sync (issue 22), loopback only:
multi-turn conversations whose turns reach random replicas keep one gateway's engine hit rate
with sync and lose it without; a killed replica loses only its own requests; a restarted one
is ready only after catching up; a partitioned one degrades to its own view and recovers. The
observed propagation delay is printed (``-s``) and bounded."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from replica_sync_support import Replicas
from replica_sync_workload import chat, conversations, hit_counters

from support.waiting import wait_until
from warmfleet.emulator.config import build_spec
from warmfleet.emulator.fleet import EmulatedFleet
from warmfleet.routing.parse import parse_chat
from warmfleet.routing.request import ChatRequest

pytestmark = pytest.mark.slow

# short peer timeouts so the fault tests stay short
FAST_PEERS = {"heartbeat_interval_s": 0.1, "peer_timeout_s": 0.5, "catch_up_timeout_s": 5.0}


@asynccontextmanager
async def _fleet(instances: int = 3, speedup: float = 50.0) -> AsyncIterator[EmulatedFleet]:
    spec = build_spec(
        instances=instances,
        preset="tiny-cpu",
        block_size=16,
        kv_capacity_tokens=32_768,
        speedup=speedup,
    )
    async with EmulatedFleet(spec) as fleet:
        yield fleet


@asynccontextmanager
async def _replicas(
    fleet: EmulatedFleet, directory: Path, count: int, *, synced: bool = True
) -> AsyncIterator[Replicas]:
    replicas = Replicas(fleet.urls, directory, count, synced=synced, sync=dict(FAST_PEERS))
    try:
        await replicas.start_all()
        yield replicas
    finally:
        await replicas.stop_all()


def _urls(replicas: Replicas) -> list[str | None]:
    return [s.url if s is not None else None for s in replicas.started]


async def _hit_rate(
    fleet: EmulatedFleet, session: aiohttp.ClientSession, replicas: Replicas, seed: int
) -> float:
    before = hit_counters(fleet)
    outcome = await conversations(session, lambda: _urls(replicas), seed=seed)
    after = hit_counters(fleet)
    assert outcome.failed == 0, outcome
    return (after[0] - before[0]) / (after[1] - before[1])


async def test_synced_replicas_keep_one_gateways_hit_rate(tmp_path: Path) -> None:
    rates: dict[str, float] = {}
    delays_s: list[float] = []
    async with aiohttp.ClientSession() as session:
        for label, count, synced in (("1", 1, False), ("4 no sync", 4, False), ("4 sync", 4, True)):
            async with (
                _fleet() as fleet,
                _replicas(fleet, tmp_path / label.replace(" ", "-"), count, synced=synced) as reps,
            ):
                for i in range(count):
                    await reps.wait_ready(i, session, 10.0)
                rates[label] = await _hit_rate(fleet, session, reps, seed=1)
                if synced:
                    delays_s += [
                        d for i in range(count) for d in reps.sync_of(i).metrics.recent_delays_s
                    ]
    p50_ms = statistics.median(delays_s) * 1000
    p99_ms = sorted(delays_s)[int(0.99 * (len(delays_s) - 1))] * 1000
    print(f"\nhit rates {rates}; propagation delay p50 {p50_ms:.1f} ms p99 {p99_ms:.1f} ms")
    assert rates["4 sync"] >= rates["1"] - 0.03, rates
    assert rates["4 no sync"] <= rates["1"] - 0.10, rates
    assert p50_ms < 100.0


async def test_a_killed_replica_loses_only_its_own_requests(tmp_path: Path) -> None:
    """32 streams in flight across 4 replicas; replica 0 dies: only its streams fail, the
    others forget its open requests after peer_timeout_s and keep routing with shared state."""
    async with (
        _fleet(speedup=5.0) as fleet,
        _replicas(fleet, tmp_path, 4) as reps,
        aiohttp.ClientSession() as session,
    ):
        for i in range(4):
            await reps.wait_ready(i, session, 10.0)
        urls = _urls(reps)
        body = {"model": "warmfleet-emulated", "max_tokens": 200, "stream": True}

        async def stream(n: int) -> tuple[int, bool]:
            messages = [{"role": "user", "content": f"stream {n} " + "word " * 50}]
            url = urls[n % 4]
            assert url is not None
            try:
                async with session.post(
                    url + "/v1/chat/completions", json={**body, "messages": messages}
                ) as resp:
                    data = await resp.read()
                    return n % 4, resp.status == 200 and b"[DONE]" in data
            except aiohttp.ClientError:
                return n % 4, False

        tasks = [asyncio.create_task(stream(n)) for n in range(32)]
        origin = reps.sync_of(0).origin
        view = reps.sync_of(1).views["main/v1"]
        await wait_until(lambda: view.open_requests().get(origin, 0) == 8, timeout_s=10.0)
        await reps.kill(0)
        assert view.open_requests()[origin] == 8
        results = await asyncio.gather(*tasks)
        failed = {replica for replica, ok in results if not ok}
        assert failed == {0}, results  # its own streams were cut
        assert all(ok for replica, ok in results if replica != 0)
        await asyncio.sleep(FAST_PEERS["peer_timeout_s"] * 2 + 0.3)
        for i in (1, 2, 3):
            describe = reps.sync_of(i).describe()
            open_requests = describe["open_requests"]
            assert isinstance(open_requests, dict)
            assert all(not n for view in open_requests.values() for n in view.values())
            assert len(describe["peers_gone"]) == 1  # type: ignore[arg-type]
        assert await _hit_rate(fleet, session, reps, seed=2) >= 0.5


async def test_a_restarted_replica_is_ready_only_after_catching_up(tmp_path: Path) -> None:
    async with (
        _fleet() as fleet,
        _replicas(fleet, tmp_path, 3) as reps,
        aiohttp.ClientSession() as session,
    ):
        for i in range(3):
            await reps.wait_ready(i, session, 10.0)
        synced_rate = await _hit_rate(fleet, session, reps, seed=3)
        await reps.stop(2)
        await reps.start(2)
        restarted = reps.sync_of(2)
        while True:
            async with session.get(reps.app(2).url + "/ready") as resp:
                ready = await resp.json()
                assert resp.status == 503 or ready["replica_sync"]["caught_up"]
                if resp.status == 200:
                    break
            await asyncio.sleep(0.02)
        assert restarted.caught_up
        assert restarted.metrics.catch_up_notes._value.get() > 0
        assert restarted.metrics.catch_up_timeouts._value.get() == 0
        # its first decisions already know where the others sent the conversations: their
        # first turns sent again, to it alone, find their prefixes (knowing nothing, it would
        # place each on a cold instance with a chance of 2 in 3)
        only_it = Replicas(reps.urls, tmp_path, 3)
        only_it.started = [None, None, reps.app(2)]
        before = hit_counters(fleet)
        outcome = await conversations(session, lambda: _urls(only_it), seed=3, turns=1)
        after = hit_counters(fleet)
        assert outcome.failed == 0
        replayed_rate = (after[0] - before[0]) / (after[1] - before[1])
        assert replayed_rate >= 0.8, (replayed_rate, synced_rate)


async def test_a_partitioned_replica_degrades_and_recovers(tmp_path: Path) -> None:
    async with (
        _fleet() as fleet,
        _replicas(fleet, tmp_path, 3) as reps,
        aiohttp.ClientSession() as session,
    ):
        for i in range(3):
            await reps.wait_ready(i, session, 10.0)
        reps.write_peers(2, [])  # replica 2 hears nobody, nobody hears it
        reps.write_peers(0, [1])
        reps.write_peers(1, [0])
        gone = reps.sync_of(2).describe  # each peer goes after peer_timeout_s of silence
        await wait_until(
            lambda: len(gone()["peers_gone"]) == 2,  # type: ignore[arg-type]
            what="both peers gone",
        )
        # conversations started on 0 and 1 during the partition: 2 has not learnt them
        messages = [{"role": "system", "content": "partitioned context " * 60}]
        for i in (0, 1):
            url = reps.app(i).url
            assert await chat(session, url, [*messages, {"role": "user", "content": str(i)}])
        variant = reps.app(2).gateway.state.endpoint("main").variant("v1")
        key = variant.router.key(_chat(messages))
        assert variant.router.choose(key, variant.snapshot()).predicted_cached_blocks == 0
        reps.connect_all()  # healed: 2 hears them again and replays their logs
        await wait_until(
            lambda: variant.router.choose(key, variant.snapshot()).predicted_cached_blocks > 0,
            timeout_s=15.0,
            step_s=0.05,
            what="replica 2 caught up after the partition",
        )
        # each peer counts as back once heard (a batch or a heartbeat), which may come after
        # the other peer's log taught replica 2 the conversation
        await wait_until(
            lambda: not gone()["peers_gone"],
            timeout_s=15.0,
            step_s=0.05,
            what="replica 2 hears both peers after the partition",
        )


def _chat(messages: list[dict[str, str]]) -> ChatRequest:
    return parse_chat({"model": "warmfleet-emulated", "messages": messages})
