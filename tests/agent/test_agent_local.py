"""Local / shared file system source: sha256 manifest, in-kernel ranged copy, change detection."""

from __future__ import annotations

import hashlib
import os

import pytest
from cache_support import manager_for

from warmfleet.agent.sources.base import SourceChangedError


async def test_local_dir_copy_in_chunks_is_verified(tmp_path):
    src = tmp_path / "model"
    (src / "shards").mkdir(parents=True)
    files = {"shards/a.safetensors": os.urandom(700_000), "config.json": b"{}", "empty": b""}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    async with manager_for(tmp_path / "cache", chunk=64 * 1024) as m:
        rec = await m.prefetch(str(src))
        manifest = m.store.read_marker(rec.key)["manifest"]
        assert {f["path"]: f["sha256"] for f in manifest["files"]} == {
            rel: hashlib.sha256(d).hexdigest() for rel, d in files.items()
        }
        for rel, data in files.items():
            assert (tmp_path / "cache" / "objects" / rec.key / rel).read_bytes() == data


async def test_local_file_changed_after_resolve_is_refused(tmp_path):
    src = tmp_path / "w.bin"
    src.write_bytes(os.urandom(100_000))
    async with manager_for(tmp_path / "cache") as m:
        manifest = await m.resolve(str(src))
        src.write_bytes(os.urandom(100_000))
        os.utime(src, ns=(1, 1))
        with pytest.raises(SourceChangedError):
            await m.ensure(manifest, "w")
        assert not any((tmp_path / "cache" / "objects").iterdir())
        again = await m.prefetch(str(src))  # re-resolved: a new version
        assert again.key != manifest.key()
