"""``kube.watch.ListWatch`` against a fake API server on 127.0.0.1 whose watches end at once
(a proxy closing them, an empty 200, a 410 Gone every time): the next list waits with a capped,
jittered backoff and the streak is reported, while a long watch that ends normally relists at
once. Also: watch events over aiohttp's line limit, an event over our own bound, and a
kubeconfig or CA that cannot be used (retried with the same backoff, not a crash). Time is fake:
the watcher's sleeps and clock are injected, the server advances the clock by each watch's
length."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from warmfleet.core.kubeapi import KubeApiSpec
from warmfleet.kube.access import Backoff, KubeAccessError
from warmfleet.kube.watch import ListWatch

RETRY_S = 2.0
CAP_S = 30.0
GONE = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}


class Fake:
    """The watcher's time (``sleep`` records, ``clock`` reads ``now``) and what it reported."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.delays: list[float] = []
        self.errors: list[tuple[BaseException, bool]] = []
        self.changes: list[list[str]] = []

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        self.now += delay
        await asyncio.sleep(0)

    def clock(self) -> float:
        return self.now

    def on_error(self, err: BaseException, first: bool) -> None:
        self.errors.append((err, first))

    def on_change(self, objects: Any) -> None:
        self.changes.append(sorted(objects))


class FakeApi:
    """LIST: one object; WATCH: writes ``events`` (in pieces of ``piece`` bytes), takes
    ``lengths[i]`` seconds of fake time (the last one repeats), then ends without an error."""

    def __init__(
        self, fake: Fake, lengths: list[float], events: list[Any], *, lists: int, piece: int = 0
    ) -> None:
        self.fake, self.lengths, self.piece = fake, lengths, piece
        self.body = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        self.lists = self.watches = 0
        self.want_lists = lists
        self.enough = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            self.lists += 1
            if self.lists >= self.want_lists:
                self.enough.set()
            item = {"metadata": {"name": "node-a"}}
            return web.json_response({"metadata": {"resourceVersion": "7"}, "items": [item]})
        self.fake.now += self.lengths[min(self.watches, len(self.lengths) - 1)]
        self.watches += 1
        resp = web.StreamResponse()
        await resp.prepare(request)
        step = self.piece or len(self.body) or 1
        for start in range(0, len(self.body), step):
            await resp.write(self.body[start : start + step])
        await resp.write_eof()
        return resp


def watcher(
    spec: KubeApiSpec, fake: Fake, sleep: Callable[[float], Awaitable[None]] | None = None
) -> ListWatch:
    return ListWatch(
        spec,
        lambda: "/api/v1/nodes",
        on_change=fake.on_change,
        on_error=fake.on_error,
        watch_timeout_s=300.0,
        retry_interval_s=RETRY_S,
        sleep=sleep or fake.sleep,
        clock=fake.clock,
        rng=random.Random(7),
    )


def spec_of(url: str = "http://127.0.0.1:9", **extra: Any) -> KubeApiSpec:
    fields = {"api_server": url, "token_path": "/nonexistent", "ca_path": "/nonexistent"}
    return KubeApiSpec(**{**fields, **extra})


@contextlib.asynccontextmanager
async def serving(api: FakeApi) -> AsyncIterator[str]:
    """The fake API server's URL while it runs (30 s: a liveness bound for the test)."""
    app = web.Application()
    app.router.add_get("/{tail:.*}", api.handle)
    async with TestServer(app, host="127.0.0.1") as server, asyncio.timeout(30):
        yield str(server.make_url("")).rstrip("/")


async def run_until_enough(api: FakeApi, make: Callable[[str], ListWatch]) -> None:
    """Runs the watcher ``make(url)`` builds until the server saw ``api.want_lists`` lists. A
    watcher that crashes fails the test."""
    async with serving(api) as url, asyncio.TaskGroup() as tg:
        task = tg.create_task(make(url).run())
        await api.enough.wait()
        task.cancel()


def assert_backoff(delays: list[float], first_failure: int = 0) -> None:
    """``delays[i]`` is the ``first_failure + i``-th retry of a streak: doubling from
    ``RETRY_S``, capped at ``CAP_S``, stretched by at most a quarter (jitter)."""
    assert delays, "the watcher never waited"
    for n, delay in enumerate(delays, start=first_failure):
        base = min(CAP_S, RETRY_S * 2**n)
        assert base <= delay <= base * 1.25, (n, delays)
    assert len(set(delays)) == len(delays)  # jittered


@pytest.mark.parametrize("events", [[], [GONE]], ids=["empty-200", "410-gone"])
async def test_a_watch_that_ends_at_once_backs_off_and_is_reported(events: list[Any]) -> None:
    fake = Fake()
    api = FakeApi(fake, [0.0], events, lists=8)
    await run_until_enough(api, lambda url: watcher(spec_of(url), fake))
    assert api.lists == 8
    assert api.watches in (7, 8)
    assert_backoff(fake.delays[:7])  # 2, 4, 8, 16, 30, 30, 30 s (+ jitter) between the lists
    assert [first for _err, first in fake.errors][:3] == [True, False, False]  # one streak
    err = fake.errors[0][0]
    assert isinstance(err, KubeAccessError)
    assert "the watch ended after 0.0 s" in str(err)
    assert fake.changes[0] == ["node-a"]  # each list was applied meanwhile


async def test_long_watches_relist_at_once_and_reset_the_streak() -> None:
    fake = Fake()
    # watches of 0 s (early), 0 s, 300 s (the server's timeout: normal), 0 s, 300 s x 3
    api = FakeApi(fake, [0.0, 0.0, 300.0, 0.0, 300.0], [GONE], lists=8)
    await run_until_enough(api, lambda url: watcher(spec_of(url), fake))
    backoffs = [d for d in fake.delays if d > 0]
    assert fake.delays[:5] == [backoffs[0], backoffs[1], 0.0, backoffs[2], 0.0]
    assert_backoff(backoffs[:2])
    assert_backoff(backoffs[2:3])  # the streak starts again
    assert set(fake.delays[4:]) == {0.0}
    assert [first for _err, first in fake.errors] == [True, False, True]


async def test_watch_events_over_aiohttps_line_limit_are_read() -> None:
    """aiohttp's readline stops at twice its read buffer: 128 KiB in older releases, 512 KiB now."""
    fake = Fake()
    big = {"metadata": {"name": "node-b", "annotations": {"x": "y" * (1 << 20)}}}
    events = [{"type": "ADDED", "object": big}, {"type": "BOOKMARK", "object": {}}]
    api = FakeApi(fake, [300.0], events, lists=2, piece=30000)
    await run_until_enough(api, lambda url: watcher(spec_of(url), fake))
    assert fake.errors == []
    assert fake.changes[:2] == [["node-a"], ["node-a", "node-b"]]


async def test_a_watch_event_over_the_bound_is_an_error_retried_with_backoff() -> None:
    fake = Fake()
    big = {"metadata": {"name": "node-b", "annotations": {"x": "y" * (300 << 10)}}}
    api = FakeApi(fake, [300.0], [{"type": "ADDED", "object": big}], lists=3, piece=7000)

    def make(url: str) -> ListWatch:
        watch = watcher(spec_of(url), fake)
        watch.max_event_bytes = 100 << 10
        return watch

    await run_until_enough(api, make)
    assert all(c == ["node-a"] for c in fake.changes)  # node-b never applied
    assert "a watch event over 102400 bytes" in str(fake.errors[0][0])
    assert [first for _err, first in fake.errors][:2] == [True, False]
    assert_backoff(fake.delays[:2])


class Enough(Exception):
    """Raised by the fake sleep to end a watcher that never reaches a server."""


async def test_an_unusable_kubeconfig_is_retried_with_backoff_not_a_crash(
    tmp_path: Path,
) -> None:
    fake = Fake()
    real_sleep = fake.sleep

    async def sleep(delay: float) -> None:
        await real_sleep(delay)
        if len(fake.delays) == 6:
            raise Enough

    spec = KubeApiSpec(kubeconfig=str(tmp_path / "missing"))
    with pytest.raises(Enough):
        await watcher(spec, fake, sleep).run()
    assert_backoff(fake.delays)
    assert [first for _err, first in fake.errors] == [True] + [False] * 5
    assert all(isinstance(err, KubeAccessError) for err, _first in fake.errors)


async def test_a_bad_ca_file_is_retried_and_a_fixed_one_used(tmp_path: Path) -> None:
    """The session is made again after errors, so a CA file fixed meanwhile is picked up."""
    fake = Fake()
    ca = tmp_path / "ca.crt"
    ca.write_text("not a certificate")
    real_sleep = fake.sleep

    async def sleep(delay: float) -> None:
        await real_sleep(delay)
        if len(fake.errors) == 3:
            # "fixed": no CA file, so the system's trust store (the fake server is http)
            ca.unlink(missing_ok=True)

    api = FakeApi(fake, [300.0], [], lists=2)
    await run_until_enough(api, lambda url: watcher(spec_of(url, ca_path=str(ca)), fake, sleep))
    assert [first for _err, first in fake.errors] == [True, False, False]
    assert "the cluster CA" in str(fake.errors[0][0])
    assert_backoff(fake.delays[:3])


def test_backoff_doubles_to_its_cap_with_seeded_jitter_and_resets() -> None:
    backoff = Backoff(RETRY_S, CAP_S, random.Random(3))
    delays = [backoff.next() for _ in range(8)]
    assert_backoff(delays)
    again = Backoff(RETRY_S, CAP_S, random.Random(3))
    assert [again.next() for _ in range(8)] == delays  # seeded: the same jitter
    assert backoff.failures == 8
    backoff.reset()
    assert backoff.failures == 0
    assert RETRY_S <= backoff.next() <= RETRY_S * 1.25
    assert Backoff(60.0, CAP_S, random.Random(1)).next() >= 60.0  # the cap never undercuts it
