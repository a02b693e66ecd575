"""Waiting for another process's download of the same artifact (its per-key lock)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from cache_support import manager_for

from harness.origin import Blob, Origin
from warmfleet.agent.manager import DownloadLockTimeoutError
from warmfleet.cache.state import ArtifactState
from warmfleet.core.errors import WarmfleetError

MB = 1 << 20


async def test_waiting_for_a_hung_lock_holder_is_bounded(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    org, url = origin
    org.put("w.bin", Blob(data=os.urandom(MB // 4)))
    async with manager_for(tmp_path, lock_wait_timeout_s=0.5) as m:
        manifest = await m.resolve(f"{url}/files/w.bin")
        with m.store.download_lock(manifest.key()) as got:  # a holder that never finishes
            assert got
            started = time.monotonic()
            with pytest.raises(DownloadLockTimeoutError, match="lock_wait_timeout_s") as info:
                await asyncio.wait_for(m.ensure(manifest, "w"), 10)  # unbounded: TimeoutError
            assert 0.5 <= time.monotonic() - started < 5.0
            assert isinstance(info.value, WarmfleetError)
        rec = await m.ensure(manifest, "w")  # the lock is free again: it downloads
        assert rec.state == ArtifactState.READY


async def test_a_pin_survives_re_admission_after_the_wait(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    """The holder failed and its record was dropped (its partial data reclaimed for space)
    while we waited: the re-admission keeps the pin we asked for."""
    org, url = origin
    org.put("w.bin", Blob(data=os.urandom(MB // 4)))
    async with manager_for(tmp_path) as m:
        manifest = await m.resolve(f"{url}/files/w.bin")
        key = manifest.key()
        with m.store.download_lock(key):
            task = asyncio.create_task(m.ensure(manifest, "w", pin=True))
            for _ in range(200):
                rec = m.store.read_index().get(key)
                if rec is not None and rec.pinned:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("ensure never admitted the artifact")
            with m.store.index_txn() as idx:
                idx.remove(key)
        rec = await asyncio.wait_for(task, 20)
        assert rec.state == ArtifactState.READY
        assert rec.pinned
