"""Local / shared file system source (the FSx for Lustre or NFS case): sha256 per file.

Symbolic links are followed only while they resolve inside the source tree (or inside one of
``sources.local_symlink_roots``); a link out of it is refused, so a source tree cannot make the
agent copy e.g. ``/root/.ssh/id_rsa`` into the cache engines read. Each file is recorded by its
resolved path and opened with ``O_NOFOLLOW``; its permission bits go into the manifest (the
store never publishes a file wider than its source)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from warmfleet.agent.digests import hash_into
from warmfleet.agent.sources.base import READ_BLOCK_BYTES, SourceChangedError, SourceError
from warmfleet.cache.manifest import FileEntry, Manifest, SourceKind
from warmfleet.cache.uri import ParsedUri
from warmfleet.core.errors import NotFoundError


def sha256_file(path: Path, on_hashed: Callable[[int], None] | None = None) -> str:
    digest = hashlib.sha256()
    hash_into(path, [digest], on_hashed)
    return digest.hexdigest()


def _stat_identity(st: os.stat_result) -> str:
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


class LocalSource:
    """Resolving hashes every file (sha256); ``hashing`` tells how far the files being resolved
    now are, for a progress display (a large model takes a while)."""

    kind = SourceKind.LOCAL

    def __init__(self, hash_concurrency: int = 2, symlink_roots: tuple[str, ...] = ()) -> None:
        self._hash_sem = asyncio.Semaphore(hash_concurrency)
        self._symlink_roots = tuple(os.path.realpath(r) for r in symlink_roots)
        # per file being resolved: [bytes hashed, size]; each item written by one thread only
        self._hashing: dict[str, list[int]] = {}
        self._hashed_bytes = 0  # of the resolves that ended

    def hashing(self) -> tuple[int, int]:
        """(bytes hashed, bytes to hash) by this source's resolves so far, those under way
        included; (0, 0) before any."""
        items = list(self._hashing.values())
        done = self._hashed_bytes + sum(item[0] for item in items)
        return done, self._hashed_bytes + sum(item[1] for item in items)

    async def resolve(self, parsed: ParsedUri, revision: str | None) -> Manifest:  # noqa: ARG002
        root = Path(parsed.location)
        if not root.exists():
            raise NotFoundError(f"local source does not exist: {root}")
        if root.is_file():
            files = [(root.name, root)]
        else:
            inside = (os.path.realpath(root), *self._symlink_roots)
            files = sorted(await asyncio.to_thread(_walk_files, root, inside))
            if not files:
                raise SourceError(f"local source directory is empty: {root}")
        for _, path in files:
            self._hashing[str(path)] = [0, path.stat().st_size]
        try:
            entries = await asyncio.gather(*(self._entry(rel, p) for rel, p in files))
        finally:
            for _, path in files:
                self._hashing.pop(str(path), None)
        self._hashed_bytes += sum(entry.size_bytes for entry in entries)
        return Manifest(SourceKind.LOCAL, parsed.uri, tuple(entries), revision=None)

    async def _entry(self, rel: str, path: Path) -> FileEntry:
        real = Path(os.path.realpath(path))
        progress = self._hashing.get(str(path), [0, 0])

        def hashed(done_bytes: int) -> None:
            progress[0] = done_bytes

        async with self._hash_sem:
            before = real.stat()
            digest = await asyncio.to_thread(sha256_file, real, hashed)
            after = real.stat()
        if _stat_identity(before) != _stat_identity(after):
            raise SourceChangedError(f"{path} changed while it was being hashed")
        return FileEntry(
            path=rel,
            size_bytes=after.st_size,
            locator=str(real),
            sha256=digest,
            last_modified=str(after.st_mtime_ns),
            mode=stat.S_IMODE(after.st_mode),
        )

    def supports_ranges(self, manifest: Manifest) -> bool:  # noqa: ARG002
        return True

    async def open_range(self, entry: FileEntry, start: int, end: int) -> AsyncIterator[bytes]:
        fd = await asyncio.to_thread(_open_source, entry)
        try:
            _check_unchanged(fd, entry)
            pos = start
            while pos < end:
                n = min(READ_BLOCK_BYTES * 4, end - pos)
                block = await asyncio.to_thread(os.pread, fd, n, pos)
                if not block:
                    raise SourceChangedError(f"{entry.locator} shrank while reading")
                pos += len(block)
                yield block
        finally:
            os.close(fd)

    def copy_range(self, entry: FileEntry, start: int, end: int, dst_fd: int) -> int:
        """In-kernel copy of ``[start, end)`` to the same offsets of ``dst_fd`` (no user-space
        buffers; what ``cp`` does). Runs in a worker thread."""
        fd = _open_source(entry)
        try:
            _check_unchanged(fd, entry)
            pos = start
            while pos < end:
                n = os.copy_file_range(fd, dst_fd, end - pos, pos, pos)
                if n <= 0:
                    raise SourceChangedError(f"{entry.locator} shrank while copying")
                pos += n
            return pos - start
        finally:
            os.close(fd)

    async def aclose(self) -> None:
        return None


def _open_source(entry: FileEntry) -> int:
    """The resolved file itself: a link put in its place after resolve is refused."""
    try:
        return os.open(entry.locator, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise SourceChangedError(f"{entry.locator} cannot be opened any more: {err}") from err


def _inside(real: str, trees: tuple[str, ...]) -> bool:
    return any(real == tree or real.startswith(tree.rstrip("/") + "/") for tree in trees)


def _check_link(path: Path, trees: tuple[str, ...]) -> None:
    if path.is_symlink() and not _inside(os.path.realpath(path), trees):
        raise SourceError(
            f"local source: {path} links to {os.path.realpath(path)}, outside the source tree "
            f"(follow it only by listing that directory in sources.local_symlink_roots)"
        )


def _walk_files(root: Path, trees: tuple[str, ...]) -> list[tuple[str, Path]]:
    """Every regular file under ``root`` as (relative posix path, path), following symbolic
    links to files and to directories (a linked shard folder is part of the model, as with
    ``cp -rL``) as long as they resolve inside ``trees`` (the source tree and the configured
    symlink roots); a link out of them and a directory link back into its own ancestry are
    refused."""
    out: list[tuple[str, Path]] = []
    for top, dirs, names in os.walk(root, followlinks=True, onerror=_raise_walk_error):
        here = Path(top)
        here_st = os.stat(here)
        for name in dirs:
            sub = here / name
            _check_link(sub, trees)
            if sub.is_symlink() and _is_ancestor(sub, here, root, here_st):
                raise SourceError(f"local source has a directory link loop: {sub}")
        for name in names:
            path = here / name
            _check_link(path, trees)
            if path.is_file():
                out.append((path.relative_to(root).as_posix(), path))
    return out


def _is_ancestor(link: Path, here: Path, root: Path, here_st: os.stat_result) -> bool:
    target = os.stat(link)
    node, st = here, here_st
    while True:
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            return True
        if node == root:
            return False
        node = node.parent
        st = os.stat(node)


def _raise_walk_error(err: OSError) -> None:
    raise SourceError(f"cannot list local source: {err}") from err


def _check_unchanged(fd: int, entry: FileEntry) -> None:
    """The open file still has the size and mtime it had when the manifest was resolved."""
    st = os.fstat(fd)
    if st.st_size != entry.size_bytes or str(st.st_mtime_ns) != entry.last_modified:
        raise SourceChangedError(f"{entry.locator} changed since it was resolved")
