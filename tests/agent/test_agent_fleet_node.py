"""The fleet node protocol without transport: what a tick does to assigned caches."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from pathlib import Path

import pytest
from cache_support import agent_config, manager_for

from harness.origin import Blob, Origin
from warmfleet.agent.fleet_node import Assignment, FleetNode
from warmfleet.agent.node_agent import NodeAgent
from warmfleet.cache.manifest import Manifest
from warmfleet.cache.state import ArtifactState

MB = 1 << 20


async def test_unassigning_a_cache_stops_its_download_and_frees_its_reservation(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    """A cache taken off the node mid-download (source changed again, endpoint deleted) must
    not keep downloading nor keep its space reserved against the caches that replace it."""
    org, url = origin
    org.put("old.bin", Blob(data=os.urandom(2 * MB)))
    org.set_throttle(MB)  # 2 s for the whole file
    async with manager_for(tmp_path, concurrency=1) as m, asyncio.TaskGroup() as tg:
        node = FleetNode(m, tg)
        node.assigned = {"old": Assignment(f"{url}/files/old.bin")}
        await node.tick()
        while org.bytes_served < 256 * 1024:
            await asyncio.sleep(0.02)
        node.assigned = {}
        await node.tick()
        await asyncio.sleep(0.3)
        served = org.bytes_served
        assert served < 2 * MB
        assert [r.state for r in m.records()] in ([], [ArtifactState.FAILED])
        await node.tick()
        assert m.records() == []
        assert not any((tmp_path / "staging").iterdir())
        await asyncio.sleep(0.5)
        assert org.bytes_served - served <= 256 * 1024  # at most a chunk in flight
        node.cancel()


async def test_a_fetch_failing_outside_the_cache_errors_does_not_take_the_agent_down(
    tmp_path: Path,
) -> None:
    """A shared file system (FSx/NFS) answering EIO/ESTALE raises a plain OSError: the fetch
    fails and is retried by a later tick, the agent's task group keeps running."""
    calls = 0

    async def stale(*_: object, **__: object) -> Manifest:
        nonlocal calls
        calls += 1
        raise OSError(errno.ESTALE, "Stale file handle")

    async with manager_for(tmp_path) as m, asyncio.TaskGroup() as tg:
        m.resolve = stale  # type: ignore[method-assign]
        node = FleetNode(m, tg)
        node.assigned = {"a": Assignment("/mnt/fsx/models/a")}
        for _ in range(2):
            await node.tick()
            await asyncio.sleep(0.05)
        assert calls == 2


async def test_one_artifact_failing_with_an_os_error_does_not_stop_the_reconcile(
    tmp_path: Path,
) -> None:
    config = agent_config(
        tmp_path,
        "  artifacts:\n"
        "    - {type: model, name: a, uri: /mnt/fsx/a}\n"
        "    - {type: model, name: b, uri: /mnt/fsx/b}\n",
    )
    tried: list[str] = []

    async def resolve(uri: str, revision: str | None = None) -> Manifest:
        tried.append(uri)
        raise OSError(errno.EIO, "Input/output error")

    agent = NodeAgent(config)
    async with manager_for(tmp_path) as m:
        m.resolve = resolve  # type: ignore[method-assign]
        await agent.reconcile_once(m)
    assert tried == ["/mnt/fsx/a", "/mnt/fsx/b"]
    assert agent.reconciles == 1


async def test_a_cache_refused_before_admission_is_reported_failed_and_logged_once(
    origin: tuple[Origin, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No record (the origin has no such file): the report says ``failed`` with the reason,
    not ``pending`` forever; two ticks log one warning; unassigned, the failure is gone."""
    _org, url = origin
    async with manager_for(tmp_path) as m, asyncio.TaskGroup() as tg:
        node = FleetNode(m, tg)
        node.assigned = {"gone": Assignment(f"{url}/files/missing.bin")}
        with caplog.at_level(logging.WARNING):
            for _ in range(2):
                await node.tick()
                while node._fetching:
                    await asyncio.sleep(0.02)
        assert m.records() == []
        report = node.reports()["gone"]
        assert report["state"] == "failed"
        assert "missing.bin" in report["message"]
        failure = m.failures.get("fleet:gone")
        assert failure is not None
        assert report["message"].startswith(failure.error_class + ": ")
        assert len([r for r in caplog.records if "gone" in r.getMessage()]) == 1
        node.assigned = {}
        await node.tick()
        assert m.failures.get("fleet:gone") is None
        assert m.failures.unadmitted() == []
