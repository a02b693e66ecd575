"""On-disk cache store: staging, atomic publish with a completion marker, index, verify.

Layout under ``root``::

    objects/<key>/...                      published artifacts (always complete)
    objects/<key>/.warmfleet-complete.json completion marker: manifest + verified digests
    staging/<key>/...                      in-progress downloads (+ progress file)
    index.json                             refs, pins, LRU times, states (under .lock)
    locks/<key>.lock                       per-key download lock (only while held or awaited)

A published directory appears only through ``rename(staging/<key>, objects/<key>)`` after the
files and the marker were fsynced, so a reader never sees a partial artifact.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmfleet.agent.digests import check_file
from warmfleet.agent.downloader import atomic_write_json
from warmfleet.agent.staged_files import published_mode
from warmfleet.cache.index import CacheIndex
from warmfleet.cache.manifest import Manifest
from warmfleet.cache.state import ArtifactRecord, ArtifactState
from warmfleet.cache.uri import parse_uri
from warmfleet.core.errors import CacheError, IntegrityError

MARKER = ".warmfleet-complete.json"
MANIFEST_FILE = ".warmfleet-manifest.json"


@dataclass(frozen=True, slots=True)
class VerifyResult:
    key: str
    ok: bool
    reason: str = ""


DELETING = ".deleting-"  # an object being deleted, renamed out of the published names


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the open file ``fd``."""
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (current.st_dev, current.st_ino) == (opened.st_dev, opened.st_ino)


class Store:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.objects = root / "objects"
        self.staging = root / "staging"
        self.locks = root / "locks"
        for d in (self.objects, self.staging, self.locks):
            d.mkdir(parents=True, exist_ok=True)

    # ----- index -------------------------------------------------------------------------
    @contextlib.contextmanager
    def index_txn(self) -> Iterator[CacheIndex]:
        """Read-modify-write of index.json under an exclusive file lock."""
        with (self.root / ".lock").open("a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            index = self._read_index()
            yield index
            atomic_write_json(self.root / "index.json", index.to_json())

    def read_index(self) -> CacheIndex:
        with (self.root / ".lock").open("a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_SH)
            return self._read_index()

    def _read_index(self) -> CacheIndex:
        try:
            data = json.loads((self.root / "index.json").read_text())
        except FileNotFoundError:
            return CacheIndex()
        except (OSError, ValueError) as err:
            raise CacheError(f"cache index {self.root / 'index.json'} unreadable: {err}") from err
        try:
            return CacheIndex.from_json(data)
        except (AttributeError, KeyError, TypeError, ValueError) as err:  # JSON of another shape
            raise CacheError(
                f"cache index {self.root / 'index.json'} is not an index: {err!r}"
            ) from err

    # ----- per-key download lock ----------------------------------------------------------
    @contextlib.contextmanager
    def download_lock(self, key: str, *, blocking: bool = True) -> Iterator[bool]:
        """Exclusive per-key lock held while downloading; released when the process dies.

        The lock file lives only while the lock is held or awaited: its holder unlinks it
        before releasing, and whoever then gets the lock on the unlinked file (it opened the
        file earlier) sees that the path no longer names it and locks the current file."""
        path = self.locks / f"{key}.lock"
        flags = fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB)
        while True:
            with path.open("a+") as fh:
                try:
                    fcntl.flock(fh.fileno(), flags)
                except BlockingIOError:
                    yield False
                    return
                if not _names(path, fh.fileno()):
                    continue  # its holder unlinked it meanwhile: lock the current file
                try:
                    yield True
                finally:
                    path.unlink(missing_ok=True)
                return

    def is_locked(self, key: str) -> bool:
        with self.download_lock(key, blocking=False) as got:
            return not got

    # ----- paths ------------------------------------------------------------------------
    def object_dir(self, key: str) -> Path:
        return self.objects / key

    def staging_dir(self, key: str) -> Path:
        return self.staging / key

    def is_published(self, key: str) -> bool:
        return (self.objects / key / MARKER).is_file()

    def read_marker(self, key: str) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((self.objects / key / MARKER).read_text())
        except (OSError, ValueError) as err:
            raise IntegrityError(f"{key[:16]}: completion marker missing or corrupt") from err
        return data

    # ----- staging / publish --------------------------------------------------------------
    def prepare_staging(self, manifest: Manifest) -> Path:
        staging = self.staging_dir(manifest.key())
        staging.mkdir(parents=True, exist_ok=True)
        atomic_write_json(staging / MANIFEST_FILE, manifest.to_json())
        return staging

    def discard_staging(self, key: str) -> None:
        shutil.rmtree(self.staging_dir(key), ignore_errors=True)

    def verify_staged(self, manifest: Manifest) -> dict[str, dict[str, str]]:
        """Full verification of a staged download; raises IntegrityError on any mismatch."""
        staging = self.staging_dir(manifest.key())
        return {e.path: check_file(staging / e.path, e) for e in manifest.files}

    def publish(self, manifest: Manifest, digests: dict[str, dict[str, str]], now_s: float) -> Path:
        key = manifest.key()
        staging = self.staging_dir(key)
        target = self.object_dir(key)
        if self.is_published(key):
            self.discard_staging(key)
            return target
        (staging / ".warmfleet-progress.json").unlink(missing_ok=True)
        (staging / MANIFEST_FILE).unlink(missing_ok=True)
        for entry in manifest.files:
            with (staging / entry.path).open("rb") as fh:
                os.fchmod(fh.fileno(), published_mode(entry.mode))  # never wider than the source
                os.fsync(fh.fileno())
        marker = {"key": key, "manifest": manifest.to_json(), "digests": digests, "at": now_s}
        atomic_write_json(staging / MARKER, marker)
        _fsync_dir(staging)
        if target.exists():  # a leftover without marker: never a valid artifact
            shutil.rmtree(target)
        os.rename(staging, target)
        _fsync_dir(self.objects)
        return target

    def delete_object(self, key: str) -> None:
        """Unpublish first (marker gone = not an artifact), then remove the files."""
        target = self.object_dir(key)
        if not target.exists():
            return
        doomed = self.objects / f"{DELETING}{key}-{os.urandom(4).hex()}"  # (one left by a crash
        os.rename(target, doomed)  # must not block this rename: ``sweep_deleting`` clears those)
        shutil.rmtree(doomed, ignore_errors=True)

    def sweep_deleting(self) -> None:
        """Remove what deletions interrupted by a crash left (unpublished already)."""
        for doomed in self.objects.glob(f"{DELETING}*"):
            shutil.rmtree(doomed, ignore_errors=True)

    # ----- verification of published artifacts ---------------------------------------------
    def verify_published(self, key: str, *, full: bool) -> VerifyResult:
        try:
            marker = self.read_marker(key)
            if marker.get("key") != key:
                raise IntegrityError(f"{key[:16]}: marker belongs to {marker.get('key')}")
            manifest = Manifest.from_json(marker["manifest"])
            if manifest.key() != key:
                raise IntegrityError(f"{key[:16]}: manifest does not hash to its key")
            digests = marker.get("digests", {})
            for entry in manifest.files:
                path = self.object_dir(key) / entry.path
                if full:
                    check_file(path, entry, digests.get(entry.path))
                elif not path.is_file() or path.stat().st_size != entry.size_bytes:
                    raise IntegrityError(f"{entry.path}: missing or wrong size")
        except (IntegrityError, CacheError, KeyError) as err:
            return VerifyResult(key, False, str(err))
        return VerifyResult(key, True)

    def published_keys(self) -> list[str]:
        return sorted(p.name for p in self.objects.iterdir() if not p.name.startswith("."))

    def staged_bytes(self, key: str) -> int:
        total = 0
        for top, _dirs, names in os.walk(self.staging_dir(key)):
            for name in names:
                try:
                    total += os.lstat(os.path.join(top, name)).st_blocks * 512
                except FileNotFoundError:  # a progress file renamed over its old one meanwhile
                    continue
        return total

    def planning_view(self, idx: CacheIndex) -> tuple[list[ArtifactRecord], dict[str, int]]:
        """The records the capacity planners may act on, and what failed downloads staged. A
        failed download whose lock another process holds (it is about to retry) is left out."""
        records: list[ArtifactRecord] = []
        staged: dict[str, int] = {}
        for rec in idx:
            if rec.state == ArtifactState.FAILED:
                if self.is_locked(rec.key):
                    continue
                staged[rec.key] = self.staged_bytes(rec.key)
            records.append(rec)
        return records, staged

    def adopt_orphans(self, idx: CacheIndex, now_s: float) -> None:
        """Index the published directories the index lost (crash between rename and index
        write); a directory that fails the cheap check is deleted."""
        for key in self.published_keys():
            if key in idx:
                continue
            if not self.verify_published(key, full=False).ok:
                self.delete_object(key)
                continue
            manifest = Manifest.from_json(self.read_marker(key)["manifest"])
            idx.put(
                ArtifactRecord(
                    key,
                    parse_uri(manifest.uri).default_name(),
                    manifest.uri,
                    manifest.size_bytes,
                    ArtifactState.READY,
                    created_s=now_s,
                    last_used_s=now_s,
                )
            )

    def free_bytes(self) -> int:
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize

    def total_bytes(self) -> int:
        st = os.statvfs(self.root)
        return st.f_blocks * st.f_frsize
