"""The fault matrix run by ``make bench-cache`` (the tests cover the same faults, smaller).

Every scenario gets its own cache root; afterwards each root is audited against the sha256 of
every content the origin ever served, so ``corrupt_or_partial_published`` counts published
artifacts that are partial or hold bytes no origin version had (it must be 0).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from harness.audit import published_corrupt_or_partial
from harness.origin import Blob, Origin, ServerThread
from warmfleet.agent.manager import CacheManager
from warmfleet.agent.sources.base import DiskFullError, SourceChangedError
from warmfleet.agent.sourceset import SourceSet
from warmfleet.agent.store import Store
from warmfleet.cache.config import CapacitySpec, DownloadSpec, NodeCacheSpec
from warmfleet.core.errors import IntegrityError, WarmfleetError

KIB = 1024
CACHE_CLI = [sys.executable, "-c", "from warmfleet.agent.cli import cache_app; cache_app()"]


@contextlib.asynccontextmanager
async def _manager(
    root: Path, free_bytes_fn: Callable[[], int] | None = None, **download: Any
) -> AsyncIterator[CacheManager]:
    dl = {"chunk": 256 * KIB, "concurrency": 4, "backoff_base_s": 0.01, **download}
    spec = NodeCacheSpec(
        root=str(root), capacity=CapacitySpec(budget=10**10), download=DownloadSpec(**dl)
    )
    async with SourceSet(spec.sources, spec.download) as sources:
        yield CacheManager(Store(root), spec, sources, free_bytes_fn=free_bytes_fn)


class FaultRun:
    def __init__(self, work: Path, origin: Origin, url: str) -> None:
        self.work, self.origin, self.url = work, origin, url
        self.genuine: set[str] = set()
        self.roots: list[Path] = []
        self.results: dict[str, dict[str, Any]] = {}
        self.injected = 0

    def blob(self, name: str, data: bytes, **kw: Any) -> Blob:
        self.genuine.add(hashlib.sha256(data).hexdigest())
        return self.origin.put(name, Blob(data=data, **kw))

    def root(self, name: str) -> Path:
        path = self.work / name
        path.mkdir(parents=True, exist_ok=True)
        self.roots.append(path)
        return path

    async def expect(
        self,
        name: str,
        faults: int,
        body: Callable[[], Awaitable[None]],
        error: type[BaseException] | None = None,
    ) -> None:
        self.injected += faults
        try:
            await body()
        except WarmfleetError as err:
            ok = error is not None and isinstance(err, error)
            self.results[name] = {
                "ok": ok,
                "faults": faults,
                "error": f"{type(err).__name__}: {err}",
            }
            return
        self.results[name] = {"ok": error is None, "faults": faults}


def _progress_chunks(root: Path) -> int:
    total = 0
    for path in (root / "staging").glob("*/.warmfleet-progress.json"):
        with contextlib.suppress(OSError, ValueError):
            total += sum(len(v) for v in json.loads(path.read_text())["done"].values())
    return total


def kill9_rounds(url: str, root: Path, kills: int) -> dict[str, Any]:
    """Start the CLI prefetch, SIGKILL it once progress grew, ``kills`` times; then finish."""
    cfg = root.parent / f"{root.name}.yaml"
    cfg.write_text(
        "apiVersion: warmfleet.dev/v1alpha1\nkind: NodeCacheConfig\nspec:\n"
        f"  root: {root}\n  capacity: {{budget: 1GiB}}\n"
        "  download: {chunk: 128KiB, concurrency: 2, fsyncEveryS: 0.05}\n"
    )
    cmd = [*CACHE_CLI, "prefetch", url, "--config", str(cfg), "--json"]
    seen, killed = 0, 0
    for _ in range(kills):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while _progress_chunks(root) < seen + 2 and time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            time.sleep(0.02)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            killed += 1
        proc.wait(10)
        seen = _progress_chunks(root)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    verify = subprocess.run(
        [*CACHE_CLI, "verify", "--full", "--config", str(cfg)],
        capture_output=True,
        timeout=300,
        check=False,
    )
    return {"killed": killed, "completed": done.returncode == 0, "verified": verify.returncode == 0}


async def run_fault_matrix(work: Path, kills: int = 3) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    origin = Origin()
    with ServerThread(origin.app) as server:
        run = FaultRun(work, origin, server.url)
        await _scenarios(run, kills)
        origin_faults = origin.faults_injected
    corrupt = sum(published_corrupt_or_partial(r, run.genuine) for r in run.roots)
    return {
        "faults_injected": run.injected,
        "origin_faults_served": origin_faults,
        "corrupt_or_partial_published": corrupt,
        "scenarios": run.results,
        "all_expected": all(r["ok"] for r in run.results.values()),
    }


async def _scenarios(run: FaultRun, kills: int) -> None:
    url = run.url
    data = os.urandom(4 * 1024 * KIB)
    run.blob("kill.bin", data)
    run.origin.set_throttle(2 * 1024 * KIB)
    k = kill9_rounds(f"{url}/files/kill.bin", run.root("kill9"), kills)
    run.origin.set_throttle(None)
    run.injected += k["killed"]
    run.results["kill9"] = {"ok": k["completed"] and k["verified"], "faults": k["killed"], **k}

    async def flaky() -> None:
        run.blob("flaky.bin", os.urandom(2 * 1024 * KIB), faults=["truncate", "error"] * 3)
        async with _manager(run.root("flaky")) as m:
            await m.prefetch(f"{url}/files/flaky.bin")

    await run.expect("truncate_and_503", 6, flaky)

    async def stall() -> None:
        run.blob("stall.bin", os.urandom(512 * KIB), faults=["stall"])
        async with _manager(run.root("stall"), request_timeout_s=1.0) as m:
            await m.prefetch(f"{url}/files/stall.bin")

    await run.expect("stalled_body", 1, stall)

    async def flip() -> None:
        run.blob("flip.bin", os.urandom(1024 * KIB), flip=True)
        async with _manager(run.root("flip")) as m:
            await m.prefetch(f"{url}/files/flip.bin")

    await run.expect("flipped_byte", 1, flip, IntegrityError)

    async def changed_during() -> None:
        run.blob("mid.bin", os.urandom(1024 * KIB))
        async with _manager(run.root("changed_during")) as m:
            manifest = await m.resolve(f"{url}/files/mid.bin")
            run.blob("mid.bin", os.urandom(1024 * KIB), mtime_s=2e9)
            await m.ensure(manifest, "mid")

    await run.expect("changed_during_download", 1, changed_during, SourceChangedError)
    await run.expect("changed_between_downloads", 1, lambda: _changed_between(run))
    await _disk_full(run)


async def _changed_between(run: FaultRun) -> None:
    url = f"{run.url}/files/ver.bin"
    run.blob("ver.bin", os.urandom(512 * KIB))
    async with _manager(run.root("changed_between")) as m:
        old = await m.prefetch(url, name="ver", holder="dep-a")
        run.blob("ver.bin", os.urandom(512 * KIB), mtime_s=2e9)
        new = await m.prefetch(url, name="ver", holder="dep-b")
        if new.key == old.key or old.key in m.gc(evict_all_unreferenced=True).evict:
            raise IntegrityError("in-place change not detected or referenced version evicted")


async def _disk_full(run: FaultRun) -> None:
    mnt = run.work / "tmpfs"
    mnt.mkdir(exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        run.results["disk_full"] = {"ok": True, "skipped": mounted.stderr.decode().strip()}
        return
    try:
        run.roots.append(mnt)
        run.blob("small.bin", os.urandom(512 * KIB))
        run.blob("huge.bin", os.urandom(6 * 1024 * KIB))
        async with _manager(mnt) as m:
            await m.prefetch(f"{run.url}/files/small.bin")
        for prealloc in (False, True):

            async def fill(prealloc: bool = prealloc) -> None:
                async with _manager(mnt, free_bytes_fn=lambda: 10**12, preallocate=prealloc) as m:
                    await m.prefetch(f"{run.url}/files/huge.bin")

            await run.expect(f"disk_full_prealloc_{prealloc}", 1, fill, DiskFullError)
        async with _manager(mnt) as m:
            intact = [r.ok for r in await m.verify(full=True)]
        run.results["disk_full_other_artifacts_intact"] = {"ok": intact == [True]}
        run.roots.remove(mnt)
        run.roots.append(_snapshot(mnt, run.work / "tmpfs-copy"))
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _snapshot(src: Path, dst: Path) -> Path:
    """Copy the tmpfs root out before unmounting so it can be audited."""
    shutil.copytree(src, dst, symlinks=True)
    return dst
