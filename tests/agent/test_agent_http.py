"""Prefetch from a real local HTTP origin: ranges, retries, integrity, versions, capacity."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from cache_support import manager_for, published_corrupt_or_partial

from harness.origin import Blob, Origin
from warmfleet.agent.sources.base import SourceChangedError, TransientSourceError
from warmfleet.cache.state import ArtifactState
from warmfleet.core.errors import InsufficientCapacityError, IntegrityError

MB = 1 << 20


async def test_ranged_parallel_download_is_verified(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    org, url = origin
    data = os.urandom(3 * MB // 2)
    org.put("w.bin", Blob(data=data))
    async with manager_for(tmp_path) as m:
        rec = await m.prefetch(f"{url}/files/w.bin", holder="dep")
        assert rec.state == ArtifactState.READY
        assert rec.refs == {"dep"}
        assert (tmp_path / "objects" / rec.key / "w.bin").read_bytes() == data
        gets = [r for r in org.requests if r.startswith("GET")]
        assert len(gets) == 6  # 1.5 MiB in 256 KiB ranges
        marker = m.store.read_marker(rec.key)
        assert marker["digests"]["w.bin"]["sha256"] == hashlib.sha256(data).hexdigest()
        assert all(r.ok for r in await m.verify(full=True))
        # a second prefetch of the same content is a cache hit: no new GETs
        await m.prefetch(f"{url}/files/w.bin")
        assert len([r for r in org.requests if r.startswith("GET")]) == 6


async def test_truncation_and_5xx_are_retried(origin: tuple[Origin, str], tmp_path: Path) -> None:
    org, url = origin
    data = os.urandom(MB)
    org.put("w.bin", Blob(data=data, faults=["truncate", "error", "truncate"]))
    async with manager_for(tmp_path) as m:
        rec = await m.prefetch(f"{url}/files/w.bin")
        assert (tmp_path / "objects" / rec.key / "w.bin").read_bytes() == data
        assert org.faults_injected == 3
        status = m.status_of(rec.key)
        assert status is not None
        assert status.retries >= 3
    assert published_corrupt_or_partial(tmp_path, {"w": data}) == 0


async def test_flipped_byte_is_detected_and_never_published(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    org, url = origin
    data = os.urandom(MB)
    org.put("w.bin", Blob(data=data, flip=True))
    async with manager_for(tmp_path) as m:
        with pytest.raises(IntegrityError, match="sha256"):
            await m.prefetch(f"{url}/files/w.bin")
        (rec,) = m.records()
        assert rec.state == ArtifactState.FAILED
        assert "IntegrityError" in rec.reason
        assert m.metrics.integrity_failures._value.get() == 2  # each verify attempt once
    assert not any((tmp_path / "objects").iterdir())
    assert not (tmp_path / "staging" / rec.key).exists()


async def test_without_origin_digest_sha256_is_recorded_and_rechecked(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    org, url = origin
    data = os.urandom(MB // 2)
    org.put("w.bin", Blob(data=data, digest_header=False))
    async with manager_for(tmp_path) as m:
        rec = await m.prefetch(f"{url}/files/w.bin")
        digests = m.store.read_marker(rec.key)["digests"]["w.bin"]
        assert digests["sha256"] == hashlib.sha256(data).hexdigest()
        path = tmp_path / "objects" / rec.key / "w.bin"
        raw = bytearray(path.read_bytes())
        raw[1000] ^= 1
        path.write_bytes(bytes(raw))  # bit rot on the node
        assert all(r.ok for r in await m.verify(full=False))  # sizes still match
        (res,) = await m.verify(full=True)
        assert not res.ok
        assert "sha256" in res.reason
        assert not (tmp_path / "objects" / rec.key).exists()
        assert m.records()[0].state == ArtifactState.FAILED


async def test_change_at_same_uri_gives_new_version_old_kept_while_referenced(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    org, url = origin
    v1, v2 = os.urandom(300_000), os.urandom(300_000)
    org.put("w.bin", Blob(data=v1, mtime_s=1_700_000_000))
    async with manager_for(tmp_path) as m:
        old = await m.prefetch(f"{url}/files/w.bin", name="w", holder="dep-a")
        org.put("w.bin", Blob(data=v2, mtime_s=1_700_000_100))
        new = await m.prefetch(f"{url}/files/w.bin", name="w", holder="dep-b")
        assert new.key != old.key
        assert (tmp_path / "objects" / new.key / "w.bin").read_bytes() == v2
        assert m.gc(evict_all_unreferenced=True).evict == ()  # both referenced
        m.drop_ref(old.key, "dep-a")
        assert m.gc(evict_all_unreferenced=True).evict == (old.key,)
        assert not (tmp_path / "objects" / old.key).exists()
        assert (tmp_path / "objects" / new.key / "w.bin").read_bytes() == v2


async def test_update_rolls_holder_to_new_version(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    org, url = origin
    org.put("w.bin", Blob(data=b"a" * 1000))
    async with manager_for(tmp_path) as m:
        old = await m.prefetch(f"{url}/files/w.bin", name="w", holder="dep")
        org.put("w.bin", Blob(data=b"b" * 1000))
        new = await m.prefetch(f"{url}/files/w.bin", name="w", holder="dep")
        recs = {r.key: r for r in m.records()}
        assert recs[new.key].refs == {"dep"}
        assert recs[old.key].refs == frozenset()


async def test_change_during_download_aborts(origin: tuple[Origin, str], tmp_path: Path) -> None:
    org, url = origin
    org.put("w.bin", Blob(data=os.urandom(MB)))
    async with manager_for(tmp_path) as m:
        manifest = await m.resolve(f"{url}/files/w.bin")
        org.put("w.bin", Blob(data=os.urandom(MB)))
        with pytest.raises(SourceChangedError):
            await m.ensure(manifest, "w")
        assert m.records()[0].state == ArtifactState.FAILED
    assert not any((tmp_path / "objects").iterdir())


async def test_interrupted_download_resumes(origin: tuple[Origin, str], tmp_path: Path) -> None:
    org, url = origin
    data = os.urandom(2 * MB)
    blob = org.put("w.bin", Blob(data=data))
    org.set_throttle(4 * MB)
    async with manager_for(tmp_path, concurrency=2) as m:
        task = asyncio.create_task(m.prefetch(f"{url}/files/w.bin"))
        while org.bytes_served < MB:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # let a progress flush happen
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        served_before = org.bytes_served
        org.set_throttle(None)
        rec = await m.prefetch(f"{url}/files/w.bin")
    assert (tmp_path / "objects" / rec.key / "w.bin").read_bytes() == data
    assert org.bytes_served - served_before < blob.size  # only the missing chunks


async def test_capacity_refusal_before_any_download(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    org, url = origin
    org.put("big.bin", Blob(data=os.urandom(MB)))
    async with manager_for(tmp_path, budget=MB // 2) as m:
        with pytest.raises(InsufficientCapacityError, match="short by"):
            await m.prefetch(f"{url}/files/big.bin")
    assert not [r for r in org.requests if r.startswith("GET")]


async def test_lru_eviction_makes_room_but_spares_pinned(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    org, url = origin
    for name in ("a", "b", "c", "d"):
        org.put(name, Blob(data=os.urandom(400_000)))
    async with manager_for(tmp_path, budget=1_000_000) as m:
        a = await m.prefetch(f"{url}/files/a", pin=True)
        b = await m.prefetch(f"{url}/files/b")
        c = await m.prefetch(f"{url}/files/c", holder="dep")
        with pytest.raises(InsufficientCapacityError):  # a pinned, c referenced -> b only
            await m.prefetch(f"{url}/files/d")
        m.drop_ref(c.key, "dep")
        await m.prefetch(f"{url}/files/d")
        keys = {r.key for r in m.records() if r.state == ArtifactState.READY}
        assert a.key in keys
        assert b.key not in keys
        assert m.metrics.evictions._value.get() >= 1


async def test_concurrent_prefetch_of_one_key_downloads_once(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    org, url = origin
    data = os.urandom(MB)
    org.put("w.bin", Blob(data=data))
    org.set_throttle(4 * MB)
    async with manager_for(tmp_path) as m1, manager_for(tmp_path) as m2:
        a, b = await asyncio.gather(
            m1.prefetch(f"{url}/files/w.bin", holder="x"),
            m2.prefetch(f"{url}/files/w.bin", holder="y"),
        )
    assert a.key == b.key
    assert org.bytes_served == len(data)  # the second waited on the per-key lock
    async with manager_for(tmp_path) as m:
        assert m.records()[0].refs == {"x", "y"}


def _disk(root: Path, size_bytes: int) -> Callable[[], int]:
    """Free space of a ``size_bytes`` disk that holds only what is allocated under ``root``."""

    def free() -> int:
        used = sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())
        return size_bytes - used

    return free


async def test_retry_after_transient_failure_counts_its_own_staged_bytes_once(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    """The staged (pre-allocated) part of a failed download is reused by its retry, so it
    must not also be taken off the free space the retry is admitted against."""
    org, url = origin
    data = os.urandom(MB)
    org.put("w.bin", Blob(data=data, faults=["error"]))
    free = _disk(tmp_path, 3 * MB // 2)
    async with manager_for(tmp_path, free_bytes_fn=free, concurrency=1, max_attempts=1) as m:
        with pytest.raises(TransientSourceError):
            await m.prefetch(f"{url}/files/w.bin")
        assert free() < MB  # the staging area holds its allocation
        rec = await m.prefetch(f"{url}/files/w.bin")
    assert (tmp_path / "objects" / rec.key / "w.bin").read_bytes() == data


async def test_rollback_to_a_cached_version_moves_the_holder_back(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    """v1 -> v2 -> v1 while v1 is still on disk: the holder leaves v2 (else v2 is never
    evictable), although v1 needed no download."""
    org, url = origin
    org.put("w.bin", Blob(data=b"a" * 1000, mtime_s=1_700_000_000))
    async with manager_for(tmp_path) as m:
        v1 = await m.prefetch(f"{url}/files/w.bin", name="w", holder="dep")
        org.put("w.bin", Blob(data=b"b" * 1000, mtime_s=1_700_000_100))
        v2 = await m.prefetch(f"{url}/files/w.bin", name="w", holder="dep")
        org.put("w.bin", Blob(data=b"a" * 1000, mtime_s=1_700_000_000))
        again = await m.prefetch(f"{url}/files/w.bin", name="w", holder="dep")
        assert again.key == v1.key
        recs = {r.key: r for r in m.records()}
        assert recs[v1.key].refs == {"dep"}
        assert recs[v2.key].refs == frozenset()
        assert m.gc(evict_all_unreferenced=True).evict == (v2.key,)


async def test_a_cancelled_download_holds_no_reservation_and_recovers_as_pending(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    org, url = origin
    org.put("w.bin", Blob(data=os.urandom(2 * MB)))
    org.set_throttle(2 * MB)
    async with manager_for(tmp_path, concurrency=1) as m:
        task = asyncio.create_task(m.prefetch(f"{url}/files/w.bin"))
        while org.bytes_served < MB // 2:
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        (rec,) = m.records()
        assert rec.state == ArtifactState.FAILED  # not in progress: its space is not reserved
        status = m.status_of(rec.key)
        assert status is not None
        assert status.state == ArtifactState.FAILED
    async with manager_for(tmp_path) as m:  # a restart: an interrupted download is pending
        m.recover()
        (rec,) = m.records()
        assert (rec.state, rec.reason) == (ArtifactState.PENDING, "")


async def test_gc_keeps_a_held_partial_download_for_its_resume(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    """A transient failure leaves staged chunks; while the artifact is still held (the agent's
    ``config:``/``fleet:`` holder) GC, even ``gc --all``, keeps them and the next prefetch
    resumes; once nobody holds it, GC drops the record and its staged data."""
    org, url = origin
    data = os.urandom(MB)  # 4 chunks of 256 KiB: the third GET fails
    org.put("w.bin", Blob(data=data, faults=["", "", "error"]))
    async with manager_for(tmp_path, concurrency=1, max_attempts=1) as m:
        with pytest.raises(TransientSourceError):
            await m.prefetch(f"{url}/files/w.bin", name="w", holder="config:w")
        (rec,) = m.records()
        staged = m.store.staged_bytes(rec.key)
        assert staged > 0
        m.gc()  # the node agent's reconcile
        m.gc(evict_all_unreferenced=True)  # a fleet tick
        (kept,) = m.records()
        assert (kept.state, kept.refs) == (ArtifactState.FAILED, frozenset({"config:w"}))
        assert m.store.staged_bytes(rec.key) == staged
        served = org.bytes_served
        again = await m.prefetch(f"{url}/files/w.bin", name="w", holder="config:w")
        assert again.key == rec.key
        assert org.bytes_served - served == MB // 2  # only the two missing chunks
        assert (tmp_path / "objects" / rec.key / "w.bin").read_bytes() == data

        org.put("x.bin", Blob(data=os.urandom(MB), faults=["", "error"]))
        with pytest.raises(TransientSourceError):
            await m.prefetch(f"{url}/files/x.bin", name="x", holder="config:x")
        failed = next(r for r in m.records() if r.name == "x")
        m.drop_ref(failed.key, "config:x")  # no longer configured
        m.gc()
        assert [r.name for r in m.records()] == ["w"]
        assert not m.store.staging_dir(failed.key).exists()
