"""The source plug-in interface: resolve a URI to a manifest, then stream byte ranges."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from warmfleet.cache.manifest import FileEntry, Manifest, SourceKind
from warmfleet.cache.uri import ParsedUri
from warmfleet.core.errors import CacheError

READ_BLOCK_BYTES = 1 << 20


class SourceError(CacheError):
    """The origin refused or failed permanently (404, 403, bad response)."""


class TransientSourceError(SourceError):
    """Worth retrying: connection reset, truncated body, timeout, 5xx, throttling.
    ``retry_after_s`` is the origin's ``Retry-After`` (429/503), the least wait before a retry."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TooSlowError(TransientSourceError):
    """The origin sent less than ``download.min_download_rate_bytes_per_s`` over
    ``download.low_speed_time_s`` (a stalled or trickling body); retried like other transient
    faults, then the artifact fails with this reason."""


class AuthChallengeError(SourceError):
    """HTTP 401: the credentials are missing or expired; ``challenge`` is the origin's
    ``WWW-Authenticate`` header (a registry token may be refreshed and the request repeated)."""

    def __init__(self, message: str, challenge: str) -> None:
        super().__init__(message)
        self.challenge = challenge


class SourceChangedError(SourceError):
    """The object at the URI no longer matches the resolved manifest (ETag/size/mtime)."""


class DiskFullError(CacheError):
    """The file system ran out of space while staging; nothing was published."""


class Source(Protocol):
    kind: SourceKind

    async def resolve(self, parsed: ParsedUri, revision: str | None) -> Manifest:
        """Build the manifest (files, sizes, content identity) without downloading data."""
        ...

    def open_range(self, entry: FileEntry, start: int, end: int) -> AsyncIterator[bytes]:
        """Yield the bytes ``[start, end)`` of ``entry``; raise SourceChangedError if the
        object is no longer the resolved version, TransientSourceError for retryable faults."""
        ...

    def supports_ranges(self, manifest: Manifest) -> bool: ...

    async def aclose(self) -> None: ...
