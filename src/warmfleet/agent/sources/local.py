"""Local / shared file system source (the FSx for Lustre or NFS case).

Resolving only stats the files: a file's identity is its size, mtime, permission bits and a
local validator (inode and ctime, which every write, rename or ``touch`` changes), so an
unchanged tree resolves in milliseconds and a changed file is a new cache version. The copy
(``copy_hashed``, one chunk at a time, chunks of a file in parallel) reads the source once: each
block is hashed (sha256 per chunk, recorded in the published marker as the file's piece tree) and
written from the buffer that was hashed (``local_copy``: ``O_DIRECT`` where it can, else a copy
read back and compared); the source must still be the resolved version after each chunk
(docs/cache.md, "Local sources").

Symbolic links are followed only while they resolve inside the source tree (or inside one of
``sources.local_symlink_roots``); a link out of it is refused, so a source tree cannot make the
agent copy e.g. ``/root/.ssh/id_rsa`` into the cache engines read. Each file is recorded by its
resolved path and opened with ``O_NOFOLLOW``; its permission bits go into the manifest (the
store never publishes a file wider than its source)."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

from warmfleet.agent.sources.base import READ_BLOCK_BYTES, SourceChangedError, SourceError
from warmfleet.agent.sources.local_copy import RangeCopier
from warmfleet.cache.manifest import FileEntry, Manifest, SourceKind
from warmfleet.cache.uri import ParsedUri
from warmfleet.core.errors import IntegrityError, NotFoundError


def local_validator(st: os.stat_result) -> str:
    """The version of a local file beyond size and mtime (the manifest's ``etag``): inode and
    ctime, the same on every node that mounts one shared file system (no device number)."""
    return f"local:{st.st_ino}:{st.st_ctime_ns}"


class LocalSource:
    """Resolving stats every file; ``copy_hashed`` copies and hashes in one read."""

    kind = SourceKind.LOCAL

    def __init__(self, symlink_roots: tuple[str, ...] = ()) -> None:
        self._symlink_roots = tuple(os.path.realpath(r) for r in symlink_roots)
        self._copier = RangeCopier()  # per worker thread: reused copy buffers

    async def resolve(self, parsed: ParsedUri, revision: str | None) -> Manifest:  # noqa: ARG002
        root = Path(parsed.location)
        if not root.exists():
            raise NotFoundError(f"local source does not exist: {root}")
        inside: tuple[str, ...] | None = None  # a file named as the source: no tree to stay in
        if root.is_file():
            files = [(root.name, root)]
        else:
            inside = (os.path.realpath(root), *self._symlink_roots)
            files = sorted(await asyncio.to_thread(_walk_files, root, inside))
            if not files:
                raise SourceError(f"local source directory is empty: {root}")
        entries = await asyncio.to_thread(lambda: [_entry(rel, p, inside) for rel, p in files])
        return Manifest(SourceKind.LOCAL, parsed.uri, tuple(entries), revision=None)

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

    def copy_hashed(
        self, entry: FileEntry, start: int, end: int, dst_fd: int, *, write: bool, direct: bool
    ) -> bytes:
        """Copy ``[start, end)`` of the source to the same offsets of ``dst_fd`` (``write=False``:
        a range staged by an earlier attempt, left as it is), reading the source once; bytes
        read back must equal the source's, else IntegrityError (``local_copy``; ``direct``:
        ``O_DIRECT`` may be used, which every range of the file must agree on). Returns the
        sha256 digest of the range. The source must be the resolved version before and after.
        Runs in a worker thread; ranges of one file are copied in parallel."""
        fd = _open_source(entry)
        try:
            _check_unchanged(fd, entry)
            try:
                digest = self._copier.copy_range(
                    entry, fd, dst_fd, start, end, write=write, direct=direct
                )
            except IntegrityError:
                _check_unchanged(fd, entry)  # a source written meanwhile: SourceChangedError
                raise
            _check_unchanged(fd, entry)
            return digest
        finally:
            os.close(fd)

    async def aclose(self) -> None:
        return None


def _open_source(entry: FileEntry) -> int:
    """The resolved file itself: a link put in its place after resolve is refused, and so is
    anything but a regular file (``O_NONBLOCK``: opening a FIFO put in its place must not
    block the worker thread for ever waiting for a writer)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(entry.locator, flags)
    except OSError as err:
        raise SourceChangedError(f"{entry.locator} cannot be opened any more: {err}") from err
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SourceChangedError(f"{entry.locator} is no longer a regular file")
    os.set_blocking(fd, True)
    return fd


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


def _entry(rel: str, path: Path, trees: tuple[str, ...] | None) -> FileEntry:
    """``path``'s entry, its link resolved again and checked again: a file swapped for a link
    out of ``trees`` after the walk checked it must not be read."""
    real = os.path.realpath(path)
    if trees is not None and not _inside(real, trees):
        raise SourceError(f"local source: {path} now resolves to {real}, outside the source tree")
    st = os.stat(real)
    return FileEntry(
        path=rel,
        size_bytes=st.st_size,
        locator=real,
        etag=local_validator(st),
        last_modified=str(st.st_mtime_ns),
        mode=stat.S_IMODE(st.st_mode),
    )


def _check_unchanged(fd: int, entry: FileEntry) -> None:
    """The open file is still the version resolved: size, mtime and validator (a write,
    even one that restores the mtime, changes the ctime)."""
    st = os.fstat(fd)
    if (
        st.st_size != entry.size_bytes
        or str(st.st_mtime_ns) != entry.last_modified
        or (entry.etag is not None and local_validator(st) != entry.etag)
    ):
        raise SourceChangedError(f"{entry.locator} changed since it was resolved")
