"""HTTP(S) source (aiohttp): HEAD for size / ETag / Last-Modified / digest, ranged GETs
guarded by ``If-Match`` so a changed object fails fast instead of mixing versions."""

from __future__ import annotations

import base64
import binascii
import email.utils
import posixpath
import re
import time
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

import aiohttp

from warmfleet.agent.sources.base import (
    AuthChallengeError,
    SourceChangedError,
    SourceError,
    TransientSourceError,
)
from warmfleet.cache.manifest import FileEntry, Manifest, SourceKind
from warmfleet.cache.uri import ParsedUri
from warmfleet.core.errors import NotFoundError

RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
HEAD_REFUSED = frozenset({403, 405})  # presigned URLs (signed for GET), GET-only origins
_CONTENT_RANGE_RE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


def parse_repr_digest(headers: Mapping[str, str]) -> str | None:
    """sha256 hex from ``Repr-Digest: sha-256=:<b64>:`` or ``Digest: SHA-256=<b64>``."""
    for name in ("Repr-Digest", "Digest"):
        value = headers.get(name)
        if not value:
            continue
        for item in value.split(","):
            algo, _, raw = item.strip().partition("=")
            if algo.lower() == "sha-256":
                try:
                    return base64.b64decode(raw.strip(":")).hex()
                except (binascii.Error, ValueError):
                    return None
    return None


def make_session(concurrency: int, timeout_s: float) -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
    connector = aiohttp.TCPConnector(limit=max(concurrency * 2, 4))
    return aiohttp.ClientSession(timeout=timeout, connector=connector, auto_decompress=False)


class HttpSource:
    kind = SourceKind.HTTP

    def __init__(self, session: aiohttp.ClientSession, headers: Mapping[str, str] | None = None):
        self._session = session
        self._headers = dict(headers or {})

    async def resolve(self, parsed: ParsedUri, revision: str | None) -> Manifest:  # noqa: ARG002
        entry, accept_ranges = await self.head_entry(parsed.location, None)
        extra = {"accept_ranges": "bytes" if accept_ranges else "none"}
        return Manifest(SourceKind.HTTP, parsed.uri, (entry,), revision=None, extra=extra)

    async def head_entry(self, url: str, path: str | None) -> tuple[FileEntry, bool]:
        headers = {**self._headers, "Accept-Encoding": "identity"}
        name = path or posixpath.basename(urlsplit(url).path) or "file"
        try:
            async with self._session.head(url, headers=headers, allow_redirects=True) as resp:
                if resp.status not in HEAD_REFUSED:
                    _raise_for_status(resp.status, url)
                    ranges = resp.headers.get("Accept-Ranges", "").lower() == "bytes"
                    size = resp.headers.get("Content-Length")
                    return _entry_from_headers(url, name, size, resp.headers), ranges
            # HEAD refused (a presigned URL is signed for GET only): ask for the first byte
            probe = {**headers, "Range": "bytes=0-0"}
            async with self._session.get(url, headers=probe) as resp:
                total = _content_range_total(resp.headers.get("Content-Range", ""))
                if resp.status in (206, 416) and total is not None:
                    return _entry_from_headers(url, name, str(total), resp.headers), True
                _raise_for_status(resp.status, url)
                size = resp.headers.get("Content-Length")  # 200: the origin has no ranges
                return _entry_from_headers(url, name, size, resp.headers), False
        except aiohttp.ClientError as err:
            raise TransientSourceError(f"HEAD {url}: {err}") from err

    def supports_ranges(self, manifest: Manifest) -> bool:
        return manifest.extra.get("accept_ranges", "bytes") == "bytes"

    def open_range(self, entry: FileEntry, start: int, end: int) -> AsyncIterator[bytes]:
        return self.open_range_with(entry, start, end, {})

    async def open_range_with(
        self, entry: FileEntry, start: int, end: int, extra_headers: Mapping[str, str]
    ) -> AsyncIterator[bytes]:
        headers = {**self._headers, **extra_headers, "Accept-Encoding": "identity"}
        whole = start == 0 and end == entry.size_bytes
        if not whole:
            headers["Range"] = f"bytes={start}-{end - 1}"
        if entry.etag and not entry.etag.startswith("W/"):
            headers["If-Match"] = entry.etag
        elif entry.last_modified:
            headers["If-Unmodified-Since"] = entry.last_modified
        try:
            async with self._session.get(entry.locator, headers=headers) as resp:
                _raise_for_get_status(resp.status, resp.headers, entry.locator)
                if not whole and resp.status != 206:
                    raise SourceError(f"{entry.locator}: origin ignored the Range request")
                if resp.status == 206:
                    _check_content_range(entry, start, end, resp.headers)
                _check_same_version(entry, resp.headers)
                received = 0
                async for block in resp.content.iter_any():
                    received += len(block)
                    yield block
                if received != end - start:
                    raise TransientSourceError(
                        f"{entry.locator}: truncated body ({received} of {end - start} bytes)"
                    )
        except (aiohttp.ClientError, TimeoutError) as err:
            raise TransientSourceError(f"GET {entry.locator}: {err!r}") from err

    async def aclose(self) -> None:
        return None


def _entry_from_headers(
    url: str, name: str, size: str | None, headers: Mapping[str, str]
) -> FileEntry:
    if size is None or not size.isdigit():
        raise SourceError(f"{url}: origin did not report a size (Content-Length {size!r})")
    return FileEntry(
        path=name,
        size_bytes=int(size),
        locator=url,
        sha256=parse_repr_digest(headers),
        etag=headers.get("ETag"),
        last_modified=headers.get("Last-Modified"),
    )


def _content_range_total(content_range: str) -> int | None:
    """The complete length from ``bytes 0-0/<total>`` or ``bytes */<total>``."""
    _, _, total = content_range.rpartition("/")
    return int(total) if content_range.startswith("bytes ") and total.isdigit() else None


def _check_same_version(entry: FileEntry, headers: Mapping[str, str]) -> None:
    etag = headers.get("ETag")
    linked = headers.get("X-Linked-Etag")
    if entry.etag and etag and entry.etag not in (etag, linked):
        raise SourceChangedError(f"{entry.locator}: ETag changed {entry.etag} -> {etag}")


def _check_content_range(
    entry: FileEntry, start: int, end: int, headers: Mapping[str, str]
) -> None:
    """A 206 must carry the bytes asked for: data from other offsets would be written here."""
    content_range = headers.get("Content-Range", "")
    match = _CONTENT_RANGE_RE.match(content_range)
    if match is None:
        raise SourceError(f"{entry.locator}: 206 with bad Content-Range {content_range!r}")
    first, last, total = match.groups()
    if (int(first), int(last) + 1) != (start, end):
        raise SourceError(
            f"{entry.locator}: asked for bytes {start}-{end - 1}, origin sent {first}-{last}"
        )
    if total != "*" and int(total) != entry.size_bytes:
        raise SourceChangedError(
            f"{entry.locator}: size changed {entry.size_bytes} -> {total} since it was resolved"
        )


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """``Retry-After`` as seconds from now (delay-seconds or an HTTP date), None if absent."""
    value = headers.get("Retry-After", "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def _raise_for_get_status(status: int, headers: Mapping[str, str], url: str) -> None:
    if status == 412:
        raise SourceChangedError(f"{url} changed since it was resolved")
    if status == 416:
        raise SourceChangedError(f"{url}: range not satisfiable, the object shrank")
    if status == 401:
        raise AuthChallengeError(f"{url}: HTTP 401", headers.get("WWW-Authenticate", ""))
    if status in RETRYABLE_STATUS:
        raise TransientSourceError(f"{url}: HTTP {status}", retry_after_s(headers))
    _raise_for_status(status, url)


def _raise_for_status(status: int, url: str) -> None:
    if status < 400:
        return
    if status == 404:
        raise NotFoundError(f"{url}: 404 not found at the origin")
    if status in RETRYABLE_STATUS:
        raise TransientSourceError(f"{url}: HTTP {status}")
    raise SourceError(f"{url}: HTTP {status}")
