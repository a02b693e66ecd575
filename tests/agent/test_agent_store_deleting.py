"""The store's deletions and staged-bytes reads under crashes and concurrent writers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from cache_support import manager_for

from warmfleet.agent import store as store_module
from warmfleet.agent.store import DELETING


async def test_a_deletion_a_crash_interrupted_blocks_nothing_and_is_swept(tmp_path: Path) -> None:
    """A crash between the rename and the removal left ``.deleting-<key>``: the same version
    evicted again later used to fail on it for good (and stop the agent's reconcile loop)."""
    src = tmp_path / "a"
    src.mkdir()
    (src / "w.bin").write_bytes(b"a" * 1000)
    async with manager_for(tmp_path / "cache") as m:
        record = await m.prefetch(str(src), name="a")
        left = m.store.objects / f"{DELETING}{record.key}"
        left.mkdir()
        (left / "w.bin").write_bytes(b"x")
        m.gc(evict_all_unreferenced=True)
        assert not m.records()
        assert not m.store.is_published(record.key)
        m.recover()  # what an agent does when it starts
        assert not list(m.store.objects.glob(f"{DELETING}*"))


def test_staged_bytes_skips_a_file_renamed_away_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another download's progress file is written to a temporary name and renamed over the
    old one about once a second: listed, then gone before it is read."""
    store = store_module.Store(tmp_path / "cache")
    staging = store.staging_dir("k")
    staging.mkdir(parents=True)
    (staging / "w.bin").write_bytes(b"w" * 5000)
    walk = os.walk

    def listing_a_vanished_file(top: str | Path) -> Iterator[tuple[str, list[str], list[str]]]:
        for here, dirs, names in walk(top):
            yield here, dirs, [*names, ".warmfleet-progress.json.1.2.tmp"]

    monkeypatch.setattr(os, "walk", listing_a_vanished_file)
    assert store.staged_bytes("k") == os.stat(staging / "w.bin").st_blocks * 512
