"""Local / shared file system source: stat identity, sha256 while copying, change detection."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
from pathlib import Path

import pytest
from cache_support import manager_for

from warmfleet.agent.sources import local
from warmfleet.agent.sources.base import SourceChangedError, SourceError
from warmfleet.cache.config import SourcesSpec


def _piece_tree(data: bytes, piece_bytes: int) -> str:
    """sha256 over the pieces' sha256 digests, with the piece size (docs/cache.md)."""
    pieces = [data[i : i + piece_bytes] for i in range(0, len(data), piece_bytes)]
    root = hashlib.sha256(b"".join(hashlib.sha256(p).digest() for p in pieces))
    return f"{piece_bytes}:{root.hexdigest()}"


async def test_local_dir_copy_in_chunks_is_verified(tmp_path: Path) -> None:
    src = tmp_path / "model"
    (src / "shards").mkdir(parents=True)
    files = {"shards/a.safetensors": os.urandom(700_000), "config.json": b"{}", "empty": b""}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    async with manager_for(tmp_path / "cache", chunk=64 * 1024) as m:
        rec = await m.prefetch(str(src))
        marker = m.store.read_marker(rec.key)
        assert {f["path"]: f["sha256"] for f in marker["manifest"]["files"]} == dict.fromkeys(
            files
        )  # resolve only stats; the piece tree is computed while copying and recorded
        assert {rel: d["sha256_tree"] for rel, d in marker["digests"].items()} == {
            rel: _piece_tree(d, 64 * 1024) for rel, d in files.items()
        }
        for rel, data in files.items():
            assert (tmp_path / "cache" / "objects" / rec.key / rel).read_bytes() == data


async def test_local_file_changed_after_resolve_is_refused(tmp_path: Path) -> None:
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


async def test_linked_shard_directory_is_part_of_the_model(tmp_path: Path) -> None:
    """A link out of the source tree is followed only into a configured symlink root."""
    shared = tmp_path / "shared" / "shards"
    shared.mkdir(parents=True)
    shard = os.urandom(300_000)
    (shared / "model-00001.safetensors").write_bytes(shard)
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_bytes(b"{}")
    (src / "shards").symlink_to(shared, target_is_directory=True)
    async with manager_for(tmp_path / "cache") as m:
        with pytest.raises(SourceError, match="outside the source tree"):
            await m.prefetch(str(src))
    roots = SourcesSpec(local_symlink_roots=(str(tmp_path / "shared"),))
    async with manager_for(tmp_path / "cache", chunk=64 * 1024, sources=roots) as m:
        rec = await m.prefetch(str(src))
        published = tmp_path / "cache" / "objects" / rec.key
        assert (published / "shards" / "model-00001.safetensors").read_bytes() == shard
        assert (published / "config.json").read_bytes() == b"{}"


async def test_directory_link_loop_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "model"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "w.bin").write_bytes(b"w")
    (src / "sub" / "back").symlink_to(src, target_is_directory=True)
    async with manager_for(tmp_path / "cache") as m:
        with pytest.raises(SourceError, match="loop"):
            await m.prefetch(str(src))


async def test_link_out_of_the_source_tree_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.key"
    secret.write_bytes(b"private key")
    secret.chmod(0o600)
    src = tmp_path / "model"
    (src / "sub").mkdir(parents=True)
    (src / "w.bin").write_bytes(b"w" * 1000)
    (src / "sub" / "tokenizer.json").symlink_to(secret)
    async with manager_for(tmp_path / "cache") as m:
        with pytest.raises(SourceError, match=r"secret\.key, outside the source tree"):
            await m.prefetch(str(src))
        assert not m.records()
    assert not list((tmp_path / "cache").rglob("tokenizer.json"))  # nothing copied


async def test_links_inside_the_source_tree_are_followed(tmp_path: Path) -> None:
    src = tmp_path / "model"
    (src / "blobs").mkdir(parents=True)
    data = os.urandom(50_000)
    (src / "blobs" / "abc").write_bytes(data)
    (src / "model.bin").symlink_to("blobs/abc")  # an HF-cache-like layout within the tree
    (src / "more").symlink_to(src / "blobs", target_is_directory=True)
    async with manager_for(tmp_path / "cache") as m:
        rec = await m.prefetch(str(src))
    published = tmp_path / "cache" / "objects" / rec.key
    assert (published / "model.bin").read_bytes() == data
    assert (published / "more" / "abc").read_bytes() == data


async def test_published_files_are_never_wider_than_their_source(tmp_path: Path) -> None:
    src = tmp_path / "model"
    src.mkdir()
    modes = {"private.bin": 0o600, "group.bin": 0o640, "exec.sh": 0o755, "ro.bin": 0o444}
    for name, mode in modes.items():
        (src / name).write_bytes(os.urandom(20_000))
        (src / name).chmod(mode)
    async with manager_for(tmp_path / "cache", chunk=8 * 1024) as m:
        rec = await m.prefetch(str(src))
        assert [r.ok for r in await m.verify(full=True)] == [True]
    published = tmp_path / "cache" / "objects" / rec.key
    got = {name: (published / name).stat().st_mode & 0o7777 for name in modes}
    # source mode & 0o644 (the cache's mode), plus owner read
    assert got == {"private.bin": 0o600, "group.bin": 0o640, "exec.sh": 0o644, "ro.bin": 0o444}


async def test_a_changed_mode_is_a_new_version(tmp_path: Path) -> None:
    src = tmp_path / "w.bin"
    src.write_bytes(os.urandom(10_000))
    src.chmod(0o644)
    async with manager_for(tmp_path / "cache") as m:
        before = (await m.resolve(str(src))).key()
        src.chmod(0o600)  # access narrowed at the source: the cached copy must follow
        assert (await m.resolve(str(src))).key() != before


def _no_direct(_fd: int) -> None:
    return None  # what open_direct says on a file system without O_DIRECT (tmpfs)


def _cross_device(*_: object) -> int:
    raise OSError(18, "Invalid cross-device link")  # copy_file_range across file systems


@pytest.mark.parametrize("kernel_copy", [True, False])
async def test_a_fault_in_a_copy_is_caught_before_publish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_copy: bool
) -> None:
    """Where the file system has no O_DIRECT (tmpfs), each block copied is read back from the
    staged file and shown equal to the source bytes read: a byte changed on the way (by the
    kernel's copy, or by ``pwrite`` where the kernel refuses ``copy_file_range``) is an
    IntegrityError (after the retry), nothing is published; without the fault the same fill
    publishes."""
    from warmfleet.agent import direct_io  # noqa: PLC0415
    from warmfleet.agent.sources import local_copy  # noqa: PLC0415
    from warmfleet.core.errors import IntegrityError  # noqa: PLC0415

    monkeypatch.setattr(local_copy, "open_direct", _no_direct)
    if not kernel_copy:
        monkeypatch.setattr(os, "copy_file_range", _cross_device)
    src = tmp_path / "w.bin"
    src.write_bytes(os.urandom(300_000))
    real_kernel, real_pwrite = local_copy.copy_range_in_kernel, direct_io.pwrite_all

    def flip_first_byte(dst_fd: int) -> None:  # through a buffered descriptor of the file
        with open(f"/proc/self/fd/{dst_fd}", "r+b") as fh:
            first = fh.read(1)
            fh.seek(0)
            fh.write(bytes([first[0] ^ 0xFF]))

    def bad_kernel(src_fd: int, dst_fd: int, pos: int, n: int) -> None:
        real_kernel(src_fd, dst_fd, pos, n)
        if pos == 0:
            flip_first_byte(dst_fd)

    def bad_pwrite(fd: int, data: memoryview, offset: int) -> None:
        real_pwrite(fd, data, offset)
        if offset == 0:
            flip_first_byte(fd)

    monkeypatch.setattr(local_copy, "copy_range_in_kernel", bad_kernel)
    monkeypatch.setattr(local_copy, "pwrite_all", bad_pwrite)
    async with manager_for(tmp_path / "cache", chunk=64 * 1024) as m:
        with pytest.raises(IntegrityError, match="differ from the source"):
            await m.prefetch(str(src))
        assert not any((tmp_path / "cache" / "objects").iterdir())
        assert m.metrics.integrity_failures._value.get() == 2  # each verify attempt once
    monkeypatch.setattr(local_copy, "copy_range_in_kernel", real_kernel)
    monkeypatch.setattr(local_copy, "pwrite_all", real_pwrite)
    async with manager_for(tmp_path / "cache", chunk=64 * 1024) as m:
        rec = await m.prefetch(str(src))
        published = tmp_path / "cache" / "objects" / rec.key / "w.bin"
        assert published.read_bytes() == src.read_bytes()


@pytest.mark.parametrize("chunk_bytes", [64 * 1024, 10_000])
async def test_a_direct_fill_writes_the_bytes_it_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_bytes: int
) -> None:
    """Where the file system takes O_DIRECT and the chunks start on block boundaries, the
    aligned blocks go to the device from the buffer that was hashed and only a file's short
    last block goes through the page cache; chunks that do not (10,000 bytes) are copied
    through the page cache for the whole file. Either way the published bytes and the piece
    tree are the source's."""
    from warmfleet.agent import direct_io  # noqa: PLC0415
    from warmfleet.agent.sources import local_copy  # noqa: PLC0415

    probe = tmp_path / "probe"
    probe.write_bytes(b"")
    fd = os.open(probe, os.O_RDWR)
    direct = direct_io.open_direct(fd)
    os.close(fd)
    if direct is None:
        pytest.skip("this file system has no O_DIRECT")
    os.close(direct)
    written: list[tuple[int, int]] = []
    real_pwrite = direct_io.pwrite_all

    def pwrite(fd: int, data: memoryview, offset: int) -> None:
        written.append((offset, len(data)))
        real_pwrite(fd, data, offset)

    monkeypatch.setattr(local_copy, "pwrite_all", pwrite)
    monkeypatch.setattr(os, "copy_file_range", _cross_device)  # every copy is a pwrite here
    data = os.urandom(300_000)  # 73 whole blocks and a short one
    (tmp_path / "w.bin").write_bytes(data)
    async with manager_for(tmp_path / "cache", chunk=chunk_bytes) as m:
        rec = await m.prefetch(str(tmp_path / "w.bin"))
        marker = m.store.read_marker(rec.key)
    assert marker["digests"]["w.bin"]["sha256_tree"] == _piece_tree(data, chunk_bytes)
    assert (tmp_path / "cache" / "objects" / rec.key / "w.bin").read_bytes() == data
    chunks = [(off, min(chunk_bytes, 300_000 - off)) for off in range(0, 300_000, chunk_bytes)]
    if chunk_bytes % 4096:
        assert sorted(written) == chunks
    else:  # the last chunk's whole blocks directly, its short last block apart
        assert sorted(written) == [*chunks[:-1], (262_144, 36_864), (299_008, 992)]


async def test_a_rewrite_that_restores_the_mtime_is_a_new_version(tmp_path: Path) -> None:
    """Resolve does not hash: the identity has the inode and ctime, which any write changes."""
    src = tmp_path / "w.bin"
    src.write_bytes(os.urandom(50_000))
    st = src.stat()
    async with manager_for(tmp_path / "cache") as m:
        first = await m.prefetch(str(src))
        assert (await m.prefetch(str(src))).key == first.key  # unchanged: the same version
        src.write_bytes(os.urandom(50_000))
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
        second = await m.prefetch(str(src))
        assert second.key != first.key
        published = tmp_path / "cache" / "objects" / second.key / "w.bin"
        assert published.read_bytes() == src.read_bytes()


async def test_a_resumed_copy_hashes_the_chunks_staged_before(tmp_path: Path) -> None:
    """A fill stopped midway resumes: chunks already staged are not copied again, but their
    source bytes are still hashed, so the whole file is checked before publish."""
    src = tmp_path / "w.bin"
    data = os.urandom(400_000)
    src.write_bytes(data)
    key = await _stop_midway(tmp_path, src)
    async with manager_for(tmp_path / "cache", chunk=64 * 1024) as m:
        rec = await m.prefetch(str(src))
        assert rec.key == key
        assert m.metrics.integrity_failures._value.get() == 0  # passed on the first attempt
        marker = m.store.read_marker(key)
        assert marker["digests"]["w.bin"]["sha256_tree"] == _piece_tree(data, 64 * 1024)


async def _stop_midway(tmp_path: Path, src: Path) -> str:
    """A throttled fill cancelled once some chunks are recorded as staged; the key."""
    async with manager_for(tmp_path / "cache", chunk=64 * 1024, bandwidth_limit=400_000) as m:
        task = asyncio.create_task(m.prefetch(str(src)))
        key = (await m.resolve(str(src))).key()
        staged = tmp_path / "cache" / "staging" / key / ".warmfleet-progress.json"
        while not staged.exists():
            await asyncio.sleep(0.02)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return key


async def test_a_staged_chunk_changed_between_attempts_is_caught(tmp_path: Path) -> None:
    """A chunk an earlier attempt staged is not written again but still compared with the
    source: a byte flipped in it meanwhile fails that attempt, the retry starts over and
    publishes the source's bytes."""
    src = tmp_path / "w.bin"
    data = os.urandom(400_000)
    src.write_bytes(data)
    key = await _stop_midway(tmp_path, src)
    staging = tmp_path / "cache" / "staging" / key
    progress = json.loads((staging / ".warmfleet-progress.json").read_text())
    first_done = min(progress["done"]["w.bin"]) * 64 * 1024
    with (staging / "w.bin").open("r+b") as fh:
        fh.seek(first_done + 7)
        fh.write(bytes([data[first_done + 7] ^ 0x01]))
    async with manager_for(tmp_path / "cache", chunk=64 * 1024) as m:
        rec = await m.prefetch(str(src))
        assert m.metrics.integrity_failures._value.get() == 1
    assert (tmp_path / "cache" / "objects" / rec.key / "w.bin").read_bytes() == data


async def test_full_verify_rehashes_the_piece_tree(tmp_path: Path) -> None:
    """``verify --full`` recomputes a local artifact's piece tree: a flipped byte fails it."""
    src = tmp_path / "w.bin"
    src.write_bytes(os.urandom(300_000))
    async with manager_for(tmp_path / "cache", chunk=64 * 1024) as m:
        rec = await m.prefetch(str(src))
        assert [r.ok for r in await m.verify(full=True)] == [True]
        published = tmp_path / "cache" / "objects" / rec.key / "w.bin"
        published.chmod(0o644)
        with published.open("r+b") as fh:
            fh.seek(200_000)
            byte = fh.read(1)
            fh.seek(200_000)
            fh.write(bytes([byte[0] ^ 0x80]))
        (res,) = await m.verify(full=True)
        assert not res.ok
        assert "sha256_tree" in res.reason


async def test_a_file_replaced_by_a_fifo_fails_the_copy_and_does_not_hang(tmp_path: Path) -> None:
    """Opening a FIFO for reading waits for a writer: the copy blocked for ever, and so did the
    agent's stop."""
    src = tmp_path / "model"
    src.mkdir()
    (src / "w.bin").write_bytes(os.urandom(1000))
    async with manager_for(tmp_path / "cache") as m:
        manifest = await m.resolve(str(src))
        (src / "w.bin").unlink()
        os.mkfifo(src / "w.bin")
        with pytest.raises(SourceChangedError, match="no longer a regular file"):
            await asyncio.wait_for(m.ensure(manifest, "m"), 30)


async def test_a_file_swapped_for_a_link_after_the_walk_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk checked a regular file; a tenant swaps it for a link out of the tree before
    its entry is made: the entry resolves it again and refuses it (it read the target)."""
    src, secret = tmp_path / "model", tmp_path / "secret"
    src.mkdir()
    (src / "w.bin").write_bytes(b"weights")
    secret.write_bytes(b"TOP-SECRET")
    walk = local._walk_files

    def racing_walk(root: Path, trees: tuple[str, ...]) -> list[tuple[str, Path]]:
        found = walk(root, trees)
        (src / "w.bin").unlink()
        (src / "w.bin").symlink_to(secret)
        return found

    monkeypatch.setattr(local, "_walk_files", racing_walk)
    async with manager_for(tmp_path / "cache") as m:
        with pytest.raises(SourceError, match="outside the source tree"):
            await m.prefetch(str(src))
    assert not [
        p
        for p in (tmp_path / "cache").rglob("*")
        if p.is_file() and p.read_bytes() == b"TOP-SECRET"
    ]
