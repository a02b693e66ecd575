"""Resolved artifact manifests and content-derived cache keys.

A manifest is what a source says an artifact *is* at resolve time: its files, their sizes and
whatever content identity the source offers (sha256, S3 ETag/VersionId, HF commit + LFS sha256,
HTTP ETag/Last-Modified). The cache key hashes that identity, never just the URI, so an object
changed in place at the same URI resolves to a new key and therefore a new cache version.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from warmfleet.cache.presigned import identity_uri
from warmfleet.core.errors import CacheError

KEY_HEX_CHARS = 64
NAME_MAX_BYTES = 255  # one path component (Linux NAME_MAX)
PATH_MAX_BYTES = 1024  # a whole relative path (the cache root and staging prefix come on top)


class SourceKind(StrEnum):
    LOCAL = "local"
    HTTP = "http"
    S3 = "s3"
    HF = "hf"
    OCI = "oci"


class ManifestError(CacheError):
    """A manifest is malformed (bad path, duplicate file, negative size)."""


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file of an artifact. ``path`` is relative (posix), ``locator`` is source-specific
    (URL, object key, absolute path) and is *not* part of the identity."""

    path: str
    size_bytes: int
    locator: str
    sha256: str | None = None
    md5: str | None = None  # from a single-part S3 ETag
    git_sha1: str | None = None  # git blob id (HF non-LFS files): sha1(b"blob <size>\\0" + data)
    etag: str | None = None
    version_id: str | None = None
    last_modified: str | None = None
    mode: int | None = None  # permission bits at the source (local files); None: not known

    def identity(self) -> dict[str, Any]:
        ident: dict[str, Any] = {"path": self.path, "size": self.size_bytes}
        names = ("sha256", "md5", "git_sha1", "etag", "version_id", "last_modified", "mode")
        for name in names:
            value = getattr(self, name)
            if value is not None:
                ident[name] = value
        return ident

    def has_digest(self) -> bool:
        return self.sha256 is not None or self.md5 is not None or self.git_sha1 is not None


@dataclass(frozen=True, slots=True)
class Manifest:
    """A resolved artifact: source, pinned revision and files (sorted by path)."""

    kind: SourceKind
    uri: str
    files: tuple[FileEntry, ...]
    revision: str | None = None  # HF commit sha, S3 listing is per-object (VersionId in files)
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        dirs: set[str] = set()
        for entry in self.files:
            check_relpath(entry.path)
            if entry.path in seen:
                raise ManifestError(f"duplicate file {entry.path!r} in manifest of {self.uri}")
            if entry.size_bytes < 0:
                raise ManifestError(f"negative size for {entry.path!r}")
            if entry.mode is not None and not 0 <= entry.mode <= 0o7777:
                raise ManifestError(f"bad mode {entry.mode!r} for {entry.path!r}")
            seen.add(entry.path)
            parts = entry.path.split("/")
            dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
        clash = sorted(seen & dirs)
        if clash:
            raise ManifestError(
                f"{clash[0]!r} is both a file and a directory in the manifest of {self.uri}"
            )

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    def key(self) -> str:
        """Content-derived cache key (sha256 hex of the canonical identity)."""
        return cache_key(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "uri": self.uri,
            "revision": self.revision,
            "extra": dict(self.extra),
            "files": [asdict(f) for f in self.files],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        try:
            files = tuple(FileEntry(**f) for f in data["files"])
            return cls(
                kind=SourceKind(data["kind"]),
                uri=str(data["uri"]),
                files=files,
                revision=data.get("revision"),
                extra=dict(data.get("extra") or {}),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ManifestError(f"malformed manifest document: {err}") from err


def check_relpath(path: str) -> None:
    """A relative, normalised posix path the store can create: no NUL, no empty, ``.`` or
    ``..`` component, no component over NAME_MAX_BYTES and the whole at most PATH_MAX_BYTES
    (UTF-8), no component named like the store's own ``.warmfleet*`` files (a directory of
    that name clashed with them at publish). The peer server refuses the same paths."""
    if "\0" in path:
        raise ManifestError(f"file path with a NUL byte in manifest: {path!r}")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ManifestError(f"file path is not valid UTF-8: {path!r}") from err
    if len(encoded) > PATH_MAX_BYTES:
        raise ManifestError(f"file path longer than {PATH_MAX_BYTES} bytes: {path[:64]!r}...")
    for part in path.split("/"):
        if len(part.encode("utf-8")) > NAME_MAX_BYTES:
            raise ManifestError(
                f"file path component longer than {NAME_MAX_BYTES} bytes: {part[:64]!r}..."
            )
    norm = posixpath.normpath(path)
    if (
        not path
        or path.startswith("/")
        or norm != path
        or norm == "."
        or norm.startswith("../")
        or norm == ".."
        or "\\" in path
        or any(part.startswith(".warmfleet") for part in path.split("/"))
    ):
        raise ManifestError(f"unsafe or non-normalised file path in manifest: {path!r}")


def cache_key(manifest: Manifest) -> str:
    """sha256 over the canonical JSON of kind, uri (without the query parameters that sign a
    presigned URL), revision and every file's identity."""
    doc = {
        "v": 1,
        "kind": manifest.kind.value,
        "uri": identity_uri(manifest.uri),
        "revision": manifest.revision,
        "files": [f.identity() for f in sorted(manifest.files, key=lambda e: e.path)],
    }
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def short_key(key: str) -> str:
    return key[:16]
