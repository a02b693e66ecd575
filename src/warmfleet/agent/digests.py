"""Digest helpers: hash with every algorithm a manifest entry gives, compare, explain.

A file whose manifest gives no digest (a local source) is recorded by its **piece tree**
(``sha256_tree``, ``"<piece bytes>:<hex>"``): the sha256 of the concatenated raw sha256 digests
of its pieces of ``piece bytes`` (the last one shorter; an empty file has none). Unlike one
sha256 over the whole file, the pieces are hashed in parallel, on every core.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from warmfleet.cache.manifest import FileEntry, Manifest
from warmfleet.core.errors import IntegrityError

HASH_BLOCK_BYTES = 4 << 20
TREE = "sha256_tree"


def tree_value(piece_bytes: int, piece_digests: Sequence[bytes]) -> str:
    """The ``sha256_tree`` digest of a file from its pieces' raw sha256 digests, in order."""
    return f"{piece_bytes}:{hashlib.sha256(b''.join(piece_digests)).hexdigest()}"


def _piece_sha256(path: Path, start: int, end: int) -> bytes:
    h = hashlib.sha256()
    buf = bytearray(min(HASH_BLOCK_BYTES, end - start))
    view = memoryview(buf)
    with path.open("rb", buffering=0) as fh:
        pos = start
        while pos < end:
            n = os.preadv(fh.fileno(), [view[: min(len(buf), end - pos)]], pos)
            if n <= 0:
                raise IntegrityError(f"{path.name}: short read at {pos}")
            h.update(view[:n])
            pos += n
    return h.digest()


def tree_digest(path: Path, recorded: str) -> str:
    """Recompute a ``sha256_tree`` digest with the piece size ``recorded`` names (pieces on
    every core)."""
    size_text, _, _ = recorded.partition(":")
    if not size_text.isdigit() or int(size_text) <= 0:
        raise IntegrityError(f"{path.name}: unreadable {TREE} digest {recorded!r}")
    piece_bytes, size = int(size_text), path.stat().st_size
    starts = range(0, size, piece_bytes)
    with ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="warmfleet-tree") as pool:
        pieces = pool.map(lambda a: _piece_sha256(path, a, min(a + piece_bytes, size)), starts)
        return tree_value(piece_bytes, list(pieces))


def new_hashers(entry: FileEntry) -> dict[str, Any]:
    """sha256 (given, or computed to be recorded), md5 (S3 ETag), git blob sha1 (HF)."""
    hashers: dict[str, Any] = {}
    if entry.sha256 or not entry.has_digest():
        hashers["sha256"] = hashlib.sha256()
    if entry.md5:
        hashers["md5"] = hashlib.md5(usedforsecurity=False)
    if entry.git_sha1:
        git = hashlib.sha1(usedforsecurity=False)
        git.update(b"blob %d\0" % entry.size_bytes)
        hashers["git_sha1"] = git
    return hashers


def file_digests(
    path: Path, entry: FileEntry, recorded: dict[str, str] | None = None
) -> dict[str, str]:
    """Every digest the manifest gives (or sha256); a file recorded by its piece tree (and
    given none by the manifest) by that tree."""
    tree = (recorded or {}).get(TREE)
    if tree is not None and not entry.has_digest():
        return {TREE: tree_digest(path, tree)}
    hashers = new_hashers(entry)
    hash_into(path, list(hashers.values()))
    return {name: h.hexdigest() for name, h in hashers.items()}


def hash_into(
    path: Path, hashers: list[Any], on_hashed: Callable[[int], None] | None = None
) -> None:
    """Feed a file to hashers through one reused buffer; ``on_hashed`` gets the bytes so far."""
    buf = bytearray(HASH_BLOCK_BYTES)
    view = memoryview(buf)
    done = 0
    with path.open("rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            for h in hashers:
                h.update(view[:n])
            done += n
            if on_hashed is not None:
                on_hashed(done)


def check_digests(
    entry: FileEntry, got: dict[str, str], recorded: dict[str, str] | None = None
) -> None:
    expected: dict[str, str | None] = {
        "sha256": entry.sha256,
        "md5": entry.md5,
        "git_sha1": entry.git_sha1,
    }
    for name, value in (recorded or {}).items():
        expected[name] = expected.get(name) or value
    for name, digest in got.items():
        want = expected.get(name)
        if want is not None and want.lower() != digest:
            raise IntegrityError(f"{entry.path}: {name} {digest} != expected {want}")


def check_size(path: Path, entry: FileEntry) -> None:
    try:
        size = path.stat().st_size
    except OSError as err:
        raise IntegrityError(f"{entry.path}: missing ({err})") from err
    if size != entry.size_bytes:
        raise IntegrityError(f"{entry.path}: size {size} != expected {entry.size_bytes}")


def check_file(
    path: Path, entry: FileEntry, recorded: dict[str, str] | None = None
) -> dict[str, str]:
    """Verify size and digests of one staged or published file; return the digests."""
    check_size(path, entry)
    got = file_digests(path, entry, recorded)
    check_digests(entry, got, recorded)
    return got


async def verify_staged(
    staging: Path, manifest: Manifest, inline: dict[str, dict[str, str]]
) -> dict[str, dict[str, str]]:
    """Sizes + digests of a staged download; digests computed during the download are
    reused, the rest are hashed now (two files at a time)."""
    sem = asyncio.Semaphore(2)

    async def one(entry: FileEntry) -> dict[str, str]:
        path = staging / entry.path
        if entry.path in inline:
            check_size(path, entry)
            check_digests(entry, inline[entry.path])
            return inline[entry.path]
        async with sem:
            return await asyncio.to_thread(check_file, path, entry)

    results = await asyncio.gather(*(one(e) for e in manifest.files))
    return {e.path: r for e, r in zip(manifest.files, results, strict=True)}
