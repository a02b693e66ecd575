"""The embedded agent (``local.agent_proc``, run in-process here) keeps the versions it serves
after their fills offered by the fleet's tracker (a report every renewS), and leaves the tracker
when it stops cleanly. Its tracker host's clock is a manual one; real HTTP throughout."""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from harness.origin import Blob, Origin, ServerThread
from warmfleet.agent.manager import CacheManager
from warmfleet.agent.sourceset import SourceSet
from warmfleet.agent.store import Store
from warmfleet.cache.config import CapacitySpec, DownloadSpec, NodeCacheSpec, StatusSpec
from warmfleet.control.tracker import Tracker, VersionTracker
from warmfleet.core.clock import ManualClock
from warmfleet.local.agent_proc import _run
from warmfleet.local.config import PeersConfig
from warmfleet.local.procs import AGENT_TOKEN_ENV
from warmfleet.local.tracker_host import TrackerHost

TOKEN = "fleet-token-for-agent-proc"
PIECE = 64 * 1024


async def _until(cond: Callable[[], bool]) -> None:
    async with asyncio.timeout(20):  # a hang guard, not a measure
        while not cond():
            await asyncio.sleep(0.01)


def _version(host: TrackerHost) -> VersionTracker | None:
    """The version, once node n holds every piece of it."""
    for vt in host.tracker.versions.values():
        node = vt.nodes.get("n")
        if node is not None and len(node.have) == vt.pieces:
            return vt
    return None


async def _assign(url: str, host: TrackerHost, uri: str) -> None:
    extra = host.assignment_extra("n", url)
    extra["peers"]["renewS"] = 0.02  # a round at every turn
    body = {"caches": [{"cache": "w", "uri": uri}], **extra}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        aiohttp.ClientSession() as http,
        http.put(f"{url}/v1/fleet/assignments", json=body, headers=headers) as resp,
    ):
        assert resp.status == 200, await resp.text()


async def test_the_agent_keeps_its_versions_offered_and_leaves_when_it_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(AGENT_TOKEN_ENV, TOKEN)
    org = Origin()
    org.put("w.bin", Blob(data=os.urandom(3 * PIECE + 100)))
    host = TrackerHost(PeersConfig(enabled=True, piece_bytes=PIECE), TOKEN)
    clock = ManualClock()
    host.tracker = Tracker(clock, random.Random(0), host.tracker.options)
    bound_s = host.tracker.options.stall_s
    spec = NodeCacheSpec(
        root=str(tmp_path / "n"),
        capacity=CapacitySpec(budget=10**8, high_watermark_frac=1.0, low_watermark_frac=1.0),
        download=DownloadSpec(concurrency=2),
        status=StatusSpec(port=0, token_env=AGENT_TOKEN_ENV),
    )
    ready = tmp_path / "ready.json"
    stop = asyncio.Event()
    await host.start()
    try:
        with ServerThread(org.app) as server:
            async with SourceSet(spec.sources, spec.download) as sources:
                manager = CacheManager(Store(tmp_path / "n"), spec, sources)
                async with asyncio.TaskGroup() as tg:
                    agent = tg.create_task(_run(manager, tg, stop, ready))
                    await _until(ready.exists)
                    url = json.loads(ready.read_text())["url"]
                    await _assign(url, host, f"{server.url}/files/w.bin")
                    await _until(lambda: _version(host) is not None)
                    vt = _version(host)
                    assert vt is not None
                    for _ in range(4):  # twice the bound in all, renewed every half bound
                        clock.advance(bound_s / 2)
                        await _until(lambda: vt.nodes["n"].seen_s == clock.now_s())
                        assert all(vt.holders(p) == ["n"] for p in range(vt.pieces))
                    stop.set()
                    await agent
                assert not any(vt.holders(p) for p in range(vt.pieces))  # left at once
    finally:
        stop.set()
        await host.stop()
