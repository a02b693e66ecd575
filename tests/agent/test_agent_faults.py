"""Fault injection: kill -9 mid-download (repeatedly), and a full disk (small tmpfs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cache_support import manager_for, published_corrupt_or_partial

from harness.origin import Blob, Origin
from warmfleet.agent.sources.base import DiskFullError
from warmfleet.core.errors import InsufficientCapacityError

KIB = 1024
# the `warmfleet cache` sub-app alone (the root CLI also imports every other subsystem)
CLI = [sys.executable, "-c", "from warmfleet.agent.cli import cache_app; cache_app()"]


def _node_yaml(path: Path, root: Path) -> Path:
    path.write_text(
        "apiVersion: warmfleet.dev/v1alpha1\nkind: NodeCacheConfig\nspec:\n"
        f"  root: {root}\n  capacity: {{budget: 1GiB}}\n"
        "  download: {chunk: 128KiB, concurrency: 2, fsyncEveryS: 0.05, backoffBaseS: 0.01}\n"
    )
    return path


def _progress_chunks(root: Path) -> int:
    files = list((root / "staging").glob("*/.warmfleet-progress.json"))
    if not files:
        return 0
    try:
        doc = json.loads(files[0].read_text())
    except ValueError:
        return 0
    return sum(len(v) for v in doc["done"].values())


@pytest.mark.slow
def test_kill_minus_9_repeatedly_then_resume_and_verify(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    org, url = origin
    data = os.urandom(2 * 1024 * KIB)
    org.put("w.bin", Blob(data=data))
    org.set_throttle(1024 * KIB)
    root = tmp_path / "cache"
    cfg = _node_yaml(tmp_path / "node.yaml", root)
    cmd = [*CLI, "prefetch", f"{url}/files/w.bin", "--config", str(cfg), "--json"]
    kills, seen = 3, 0
    for _ in range(kills):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while _progress_chunks(root) < seen + 2 and time.monotonic() < deadline:
            assert proc.poll() is None, "prefetch finished before it could be killed"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        seen = _progress_chunks(root)
        assert not any((root / "objects").iterdir())  # never published mid-way
    assert seen >= 2 * kills  # progress survived every crash
    org.set_throttle(None)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)
    rec = json.loads(done.stdout)
    assert (root / "objects" / rec["key"] / "w.bin").read_bytes() == data
    assert org.bytes_served < 2 * len(data)  # resumed, not restarted from zero each time
    full = subprocess.run(
        [*CLI, "verify", "--full", "--config", str(cfg)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert full.returncode == 0, full.stdout
    assert published_corrupt_or_partial(root, {"w": data}) == 0


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
        capture_output=True,
        check=False,
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


async def test_disk_full_is_a_clear_error_and_publishes_nothing(
    origin: tuple[Origin, str], tmp_path: Path, tmpfs: Path
) -> None:
    org, url = origin
    small, big = os.urandom(300 * KIB), os.urandom(3 * 1024 * KIB)
    org.put("small", Blob(data=small))
    org.put("big", Blob(data=big))
    async with manager_for(tmpfs) as m:  # admission sees the real free space
        kept = await m.prefetch(f"{url}/files/small")
        with pytest.raises(InsufficientCapacityError, match="short by"):
            await m.prefetch(f"{url}/files/big")
    for prealloc in (False, True):  # the free-space probe lies: the disk fills for real
        async with manager_for(tmpfs, free_bytes_fn=lambda: 10**12, preallocate=prealloc) as m:
            with pytest.raises(DiskFullError, match="disk full"):
                await m.prefetch(f"{url}/files/big")
            assert not list((tmpfs / "staging").iterdir())  # space handed back
            assert [r.ok for r in await m.verify(full=True)] == [True]
    assert (tmpfs / "objects" / kept.key / "small").read_bytes() == small
    assert published_corrupt_or_partial(tmpfs, {"small": small, "big": big}) == 0
