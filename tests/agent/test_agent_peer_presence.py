"""A node keeps the versions it serves after their fills offered by the tracker: every renewS it
reports each one (its fill's session, nothing in it, ``want`` 0), and leaves (a new session that
holds nothing) a version it no longer serves, and every version when it stops. Against the
embedded fleet's tracker host (real HTTP), its clock a manual one."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest
from cache_support import manager_for
from peer_support import PIECE, TOKEN, serving

from harness.origin import Blob, Origin
from warmfleet.agent.peer_node import Peers
from warmfleet.agent.peer_presence import Presence
from warmfleet.agent.peer_run import Report
from warmfleet.agent.sources.base import Source
from warmfleet.cache.manifest import FileEntry, Manifest, SourceKind
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


async def test_a_version_published_before_a_restart_is_offered_again(
    origin: tuple[Origin, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent stops (it leaves the tracker) and starts again on the same cache: its first
    round joins the version on disk with every piece, in a session of its own, and then keeps
    it offered (before: nothing of it was offered until a fill of it, which never comes)."""
    org, base = origin
    org.put("w.bin", Blob(data=os.urandom(3 * PIECE + 1000)))
    monkeypatch.setenv("WARMFLEET_AGENT_TOKEN", TOKEN)
    async with _tracker_host() as (host, clock):
        async with manager_for(tmp_path / "a") as a, serving(a) as (peers, url):
            vt = await _filled(host, peers, url, f"{base}/files/w.bin")
            first = vt.nodes["a"].session
            stop = asyncio.Event()
            keeper = asyncio.create_task(peers.keep_offered(stop))
            stop.set()
            await keeper
            assert _forgotten(vt)
        async with (
            manager_for(tmp_path / "a") as restarted,  # the same cache, a new agent
            serving(restarted) as (again, url),
        ):
            again.configure({**host.assignment_extra("a", url)["peers"], "renewS": RENEW_S})
            stop = asyncio.Event()
            keeper = asyncio.create_task(again.keep_offered(stop))
            try:
                await until(lambda: _offered(vt))
                assert vt.nodes["a"].session not in (first, "")
                assert vt.nodes["a"].url == url
                clock.advance(STALL_S / 2)  # renewed as any served version
                await until(lambda: vt.nodes["a"].seen_s == clock.now_s())
                assert _offered(vt)
                assert list(again.presence.versions) == [_key(host, vt)]
            finally:
                stop.set()
                await keeper
            assert _forgotten(vt)


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
    presence = Presence()
    for key, pieces, session in (("k1", 3, "s1"), ("k2", 4, "s2"), ("k3", 5, "s3")):
        presence.filling(key, pieces, session)
    assert await presence.renew(asked, presence.ended(), served)
    assert asked.calls == []  # fills under way report by themselves
    presence.over("k1", "s1")
    presence.over("k3", "s3")  # k3: cancelled, not served
    presence.over("k2", "an earlier fill")  # not k2's fill under way: no effect
    assert await presence.renew(asked, presence.ended(), served)
    renewal, leave = sorted(asked.calls)
    assert renewal == ("k1", 3, "s1", EMPTY, 0)
    assert leave[:2] == ("k3", 5)
    assert leave[2] not in {"s1", "s2", "s3"}
    assert leave[3:] == (EMPTY, 0)
    assert sorted(presence.versions) == ["k1", "k2"]
    presence.filling("k1", 3, "s4")  # a new fill of k1: it reports by itself again
    asked.calls.clear()
    assert await presence.renew(asked, presence.ended(), served)
    assert asked.calls == []
    presence.left("k2", "s2")  # its fill failed and left by itself
    assert sorted(presence.versions) == ["k1"]


async def test_an_unanswered_renewal_says_so_and_a_stop_leaves_every_version() -> None:
    asked = _Asked()
    presence = Presence()
    presence.filling("k1", 3, "s1")
    presence.over("k1", "s1")
    presence.filling("k2", 2, "s2")  # still filling when the agent stops
    asked.answer = None
    assert not await presence.renew(asked, presence.ended(), {"k1", "k2"})
    assert presence.versions["k1"].session == "s1"  # kept: the next round tries again
    asked.calls.clear()
    await presence.leave_all(asked)
    assert sorted((k, p) for k, p, *_ in asked.calls) == [("k1", 3), ("k2", 2)]
    assert not {s for _, _, s, _, _ in asked.calls} & {"s1", "s2"}
    assert presence.versions == {}


class _HeldFirst:
    """Wraps a node's ``ask``: the first call once ``hold`` is set waits for ``release``;
    ``passed``: a report of pieces held got through meanwhile; ``done``: the held call was
    answered."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.hold = False
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.passed = asyncio.Event()
        self.done = asyncio.Event()

    async def __call__(
        self, key: str, pieces: int, session: str, report: Report, want: int
    ) -> dict[str, Any] | None:
        mine, self.hold = self.hold, False
        if mine:
            self.held.set()
            await self.release.wait()
        elif self.held.is_set() and report.have:
            self.passed.set()
        answer = await self.real(key, pieces, session, report, want)
        if mine:
            self.done.set()
        return answer  # type: ignore[no-any-return]


async def test_a_new_fill_waits_for_a_leave_still_on_its_way(
    origin: tuple[Origin, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leave of an evicted version is held on its way to the tracker while a new fill of
    that version starts: reaching the tracker after the fill's reports, it would switch the
    node's session there and back, and the tracker would forget the pieces the fill reported
    (reports are incremental). The fill waits for it, so every piece stays held there."""
    org, base = origin
    org.put("w.bin", Blob(data=os.urandom(3 * PIECE + 1000)))
    monkeypatch.setenv("WARMFLEET_AGENT_TOKEN", TOKEN)
    async with (
        _tracker_host() as (host, _clock),
        manager_for(tmp_path / "a") as a,
        serving(a) as (peers, url),
    ):
        uri = f"{base}/files/w.bin"
        key = _key(host, await _filled(host, peers, url, uri))
        assert peers._fill is not None
        asked = _HeldFirst(peers._fill.ask)
        monkeypatch.setattr(peers._fill, "ask", asked)
        a.gc(evict_all_unreferenced=True)  # no longer served: the next round leaves it
        asked.hold = True
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(peers.keep_offered(stop))
            await until(asked.held.is_set)  # the leave, on its way
            again = tg.create_task(a.prefetch(uri, name="w"))
            # Fixed: nothing gets through until the leave is answered; without the wait the
            # new fill's reports of the pieces it holds get through at once (the bound only
            # ends the fixed case).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asked.passed.wait(), 1.0)
            asked.release.set()
            await again
            await until(asked.done.is_set)
            session = peers.presence.versions[key].session  # the new fill's
            vt = host.tracker.versions[key]
            await until(lambda: vt.nodes["a"].session == session)
            assert vt.nodes["a"].have == set(range(vt.pieces))
            assert _offered(vt)
            stop.set()


class _FirstPieceOnly:
    """An origin that serves a file's first piece; the others wait until cancelled."""

    kind = SourceKind.HTTP

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def open_range(self, entry: FileEntry, start: int, end: int) -> AsyncIterator[bytes]:
        if start > 0:
            await asyncio.Event().wait()
        yield self.data[start:end]


async def test_a_cancelled_fill_is_left_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fill cancelled once it reported a piece stops being offered at once, not at the next
    renewal round (renewS: an hour here), so no peer is sent to a node that refuses it."""
    data = os.urandom(2 * PIECE)
    manifest = Manifest(SourceKind.HTTP, "http://o/f", (FileEntry("f.bin", len(data), "/x"),))
    (tmp_path / "staging").mkdir()
    monkeypatch.setenv("WARMFLEET_AGENT_TOKEN", TOKEN)
    async with (
        _tracker_host() as (host, _clock),
        manager_for(tmp_path / "a") as a,
        serving(a) as (peers, url),
    ):
        peers.configure({**host.assignment_extra("a", url)["peers"], "renewS": 3600.0})
        fill = peers._fill
        assert fill is not None
        source = cast("Source", _FirstPieceOnly(data))
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(peers.keep_offered(stop))
            filling = tg.create_task(
                fill.download(source, manifest, tmp_path / "staging", lambda _n: None)
            )
            versions = host.tracker.versions
            await until(
                lambda: manifest.key() in versions and bool(versions[manifest.key()].holders(0))
            )
            vt = versions[manifest.key()]
            session = vt.nodes["a"].session
            filling.cancel()
            await until(lambda: vt.nodes["a"].session != session)  # left, without a round due
            assert _forgotten(vt)
            assert not peers.presence.versions
            stop.set()


async def test_a_round_reads_the_index_once_and_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which versions are still served is read from the cache index (under its file lock):
    once per round, whatever the number of versions, and in a worker thread."""
    monkeypatch.setenv("WARMFLEET_AGENT_TOKEN", TOKEN)
    async with manager_for(tmp_path / "a") as a:
        peers = Peers(a)
        peers.configure({"tracker": "http://127.0.0.1:9", "node": "a", "url": "http://a",
                         "renewS": RENEW_S})  # fmt: skip
        assert peers._fill is not None
        asked = _Asked()
        monkeypatch.setattr(peers._fill, "ask", asked)
        read_index = a.store.read_index
        threads: list[int] = []

        def counted() -> Any:
            threads.append(threading.get_ident())
            return read_index()

        monkeypatch.setattr(a.store, "read_index", counted)
        for key in ("k1", "k2", "k3"):
            peers.presence.filling(key, 2, f"s-{key}")
            peers.presence.over(key, f"s-{key}")
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(peers.keep_offered(stop))
            await until(lambda: not peers.presence.versions)  # one round: each one left
            await asyncio.sleep(5 * RENEW_S)  # rounds with nothing to renew read nothing
            stop.set()
        await peers.aclose()
        assert sorted(k for k, *_ in asked.calls) == ["k1", "k2", "k3"]
        assert len(threads) == 1
        assert threads[0] != threading.get_ident()
