"""Local / shared file system source: sha256 manifest, in-kernel ranged copy, change detection."""

from __future__ import annotations

import hashlib
import os

import pytest
from cache_support import manager_for

from warmfleet.agent.sources.base import SourceChangedError, SourceError


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


async def test_linked_shard_directory_is_part_of_the_model(tmp_path):
    shared = tmp_path / "shared" / "shards"
    shared.mkdir(parents=True)
    shard = os.urandom(300_000)
    (shared / "model-00001.safetensors").write_bytes(shard)
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_bytes(b"{}")
    (src / "shards").symlink_to(shared, target_is_directory=True)
    async with manager_for(tmp_path / "cache", chunk=64 * 1024) as m:
        rec = await m.prefetch(str(src))
        published = tmp_path / "cache" / "objects" / rec.key
        assert (published / "shards" / "model-00001.safetensors").read_bytes() == shard
        assert (published / "config.json").read_bytes() == b"{}"


async def test_directory_link_loop_is_refused(tmp_path):
    src = tmp_path / "model"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "w.bin").write_bytes(b"w")
    (src / "sub" / "back").symlink_to(src, target_is_directory=True)
    async with manager_for(tmp_path / "cache") as m:
        with pytest.raises(SourceError, match="loop"):
            await m.prefetch(str(src))
