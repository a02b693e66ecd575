"""A node keeps the versions it serves after their fills offered by the tracker: every renewS it
reports each one (its fill's session, nothing in it, ``want`` 0), and leaves (a new session that
holds nothing) a version it no longer serves, and every version when it stops. Against the
embedded fleet's tracker host (real HTTP), its clock a manual one."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from cache_support import manager_for
from peer_support import PIECE, TOKEN, serving

from harness.origin import Blob, Origin
from warmfleet.agent.peer_node import Peers
from warmfleet.agent.peer_presence import Presence
from warmfleet.agent.peer_run import Report
from warmfleet.control.tracker import Tracker, VersionTracker
from warmfleet.core.clock import ManualClock
from warmfleet.local.config import PeersConfig
from warmfleet.local.tracker_host import TrackerHost

STALL_S = 30.0  # the host's bound with the default stallS
RENEW_S = 0.02  # the tests' renewS: a round at every turn


async def until(cond: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):  # a hang guard, not a measure
        while not cond():
            await asyncio.sleep(0.005)


@asynccontextmanager
async def _tracker_host() -> AsyncIterator[tuple[TrackerHost, ManualClock]]:
    host = TrackerHost(PeersConfig(enabled=True, piece_bytes=PIECE), TOKEN)
    clock = ManualClock()
    host.tracker = Tracker(clock, random.Random(0), host.tracker.options)
    assert host.tracker.options.stall_s == STALL_S
    await host.start()
    try:
        yield host, clock
    finally:
        await host.stop()


async def _filled(host: TrackerHost, peers: Peers, url: str, uri: str) -> VersionTracker:
    """Node a fills ``uri`` through the tracker; its version there, every piece held by a."""
    peers.configure({**host.assignment_extra("a", url)["peers"], "renewS": RENEW_S})
    manager = peers._manager
    rec = await manager.prefetch(uri, name="w")
    assert manager.store.is_published(rec.key)
    vt = host.tracker.versions[rec.key]
    assert [vt.holders(p) for p in range(vt.pieces)] == [["a"]] * vt.pieces
    return vt


def _key(host: TrackerHost, vt: VersionTracker) -> str:
    return next(k for k, v in host.tracker.versions.items() if v is vt)


def _offered(vt: VersionTracker) -> bool:
    return all(vt.holders(p) == ["a"] for p in range(vt.pieces))


def _forgotten(vt: VersionTracker) -> bool:
    return not any(vt.holders(p) for p in range(vt.pieces))


async def test_a_served_version_stays_offered_then_is_left_once_evicted(
    origin: tuple[Origin, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    org, base = origin
    org.put("w.bin", Blob(data=os.urandom(3 * PIECE + 1000)))
    monkeypatch.setenv("WARMFLEET_AGENT_TOKEN", TOKEN)
    async with (
        _tracker_host() as (host, clock),
        manager_for(tmp_path / "a") as a,
        serving(a) as (peers, url),
    ):
        vt = await _filled(host, peers, url, f"{base}/files/w.bin")
        session = vt.nodes["a"].session
        stop = asyncio.Event()
        keeper = asyncio.create_task(peers.keep_offered(stop))
        try:
            for _ in range(4):  # 60 s in all, twice the bound: renewed every half bound
                clock.advance(STALL_S / 2)
                await until(lambda: vt.nodes["a"].seen_s == clock.now_s())
                assert _offered(vt)
            assert vt.nodes["a"].session == session  # renewed, not refilled
            assert vt.nodes["a"].have == set(range(vt.pieces))
            a.gc(evict_all_unreferenced=True)  # nobody holds it: evicted, no longer served
            assert not a.store.is_published(_key(host, vt))
            await until(lambda: vt.nodes["a"].session != session)  # no clock advance: a left
            assert _forgotten(vt)
            assert not peers.presence.versions
        finally:
            stop.set()
            await keeper


async def test_a_stopping_node_leaves_the_tracker_at_once(
    origin: tuple[Origin, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    org, base = origin
    org.put("w.bin", Blob(data=os.urandom(2 * PIECE)))
    monkeypatch.setenv("WARMFLEET_AGENT_TOKEN", TOKEN)
    async with (
        _tracker_host() as (host, _clock),
        manager_for(tmp_path / "a") as a,
        serving(a) as (peers, url),
    ):
        vt = await _filled(host, peers, url, f"{base}/files/w.bin")
        stop = asyncio.Event()
        keeper = asyncio.create_task(peers.keep_offered(stop))
        await asyncio.sleep(5 * RENEW_S)  # a few rounds
        stop.set()
        await keeper
        assert _forgotten(vt)  # not after the bound: at once
        assert a.store.is_published(_key(host, vt))  # still on disk; just not offered


class _Asked:
    """A recording ``ask``; ``answer`` None plays an unreachable tracker."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, str, dict[str, Any], int]] = []
        self.answer: dict[str, Any] | None = {}

    async def __call__(
        self, key: str, pieces: int, session: str, report: Report, want: int
    ) -> dict[str, Any] | None:
        self.calls.append((key, pieces, session, report.body(), want))
        return self.answer


EMPTY = Report().body()


async def test_only_fills_that_are_over_are_renewed_and_only_while_served() -> None:
    served = {"k1", "k2"}
    asked = _Asked()
    presence = Presence(served.__contains__)
    for key, pieces, session in (("k1", 3, "s1"), ("k2", 4, "s2"), ("k3", 5, "s3")):
        presence.filling(key, pieces, session)
    assert await presence.renew(asked)
    assert asked.calls == []  # fills under way report by themselves
    presence.over("k1", "s1")
    presence.over("k3", "s3")  # k3: cancelled, not served
    presence.over("k2", "an earlier fill")  # not k2's fill under way: no effect
    assert await presence.renew(asked)
    renewal, leave = sorted(asked.calls)
    assert renewal == ("k1", 3, "s1", EMPTY, 0)
    assert leave[:2] == ("k3", 5)
    assert leave[2] not in {"s1", "s2", "s3"}
    assert leave[3:] == (EMPTY, 0)
    assert sorted(presence.versions) == ["k1", "k2"]
    presence.filling("k1", 3, "s4")  # a new fill of k1: it reports by itself again
    asked.calls.clear()
    assert await presence.renew(asked)
    assert asked.calls == []
    presence.left("k2", "s2")  # its fill failed and left by itself
    assert sorted(presence.versions) == ["k1"]


async def test_an_unanswered_renewal_says_so_and_a_stop_leaves_every_version() -> None:
    asked = _Asked()
    presence = Presence(lambda _key: True)
    presence.filling("k1", 3, "s1")
    presence.over("k1", "s1")
    presence.filling("k2", 2, "s2")  # still filling when the agent stops
    asked.answer = None
    assert not await presence.renew(asked)
    assert presence.versions["k1"].session == "s1"  # kept: the next round tries again
    asked.calls.clear()
    await presence.leave_all(asked)
    assert sorted((k, p) for k, p, *_ in asked.calls) == [("k1", 3), ("k2", 2)]
    assert not {s for _, _, s, _, _ in asked.calls} & {"s1", "s2"}
    assert presence.versions == {}
