"""A node agent serving the pieces it holds to its peers, from its status API port.

``GET /v1/peer/{key}/{path}`` with ``Range: bytes=a-b`` answers ``206`` with those bytes of
the file ``path`` of artifact ``key``: from the published directory when the version is
published (verified as a whole), else from the staging directory of a fill under way when the
range is exactly a piece this node has already verified and written (``PeerHoldings``). It needs
the fleet's token (``Authorization: Bearer``) although it is a GET: a peer is a member of the
fleet, not an anonymous reader. Serving is bounded so that it never starves the node's own
engine: one token bucket (``serve_bps``) over all uploads and at most ``max_uploads`` at a time
(more wait their turn); the bytes go out with ``sendfile`` (no copy through Python).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from warmfleet.agent.api_auth import bearer_matches
from warmfleet.agent.store import Store
from warmfleet.cache.manifest import ManifestError, check_relpath
from warmfleet.cache.transfer import TokenBucket
from warmfleet.core.clock import MonotonicClock

PIECE_ROUTE = "/v1/peer/{key}/{path:.+}"
log = logging.getLogger(__name__)


class PeerCounters:
    """Per-node peer-distribution figures (status and Prometheus)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.bytes_in = Counter(
            "warmfleet_cache_fill_bytes",
            "Bytes of verified pieces written by peer fills, by where they came from",
            ["source"],
            registry=registry,
        )
        self.rejected = Counter(
            "warmfleet_cache_peer_pieces_rejected",
            "Pieces from peers refused before being written (bad hash or short)",
            registry=registry,
        )
        self.dropped = Counter(
            "warmfleet_cache_peers_dropped",
            "Peers dropped for the rest of a fill (failed, stalled or served a bad piece)",
            registry=registry,
        )
        self.served = Counter(
            "warmfleet_cache_peer_served_bytes", "Bytes served to peers", registry=registry
        )
        self.figures = {"bytesFromPeers": 0, "bytesFromOrigin": 0, "piecesRejected": 0}
        self.figures.update({"peersDropped": 0, "bytesServed": 0})

    def fetched(self, size_bytes: int, *, from_origin: bool) -> None:
        source = "origin" if from_origin else "peer"
        self.bytes_in.labels(source).inc(size_bytes)
        self.figures["bytesFromOrigin" if from_origin else "bytesFromPeers"] += size_bytes

    def reject(self) -> None:
        self.rejected.inc()
        self.figures["piecesRejected"] += 1

    def drop(self) -> None:
        self.dropped.inc()
        self.figures["peersDropped"] += 1

    def serve(self, size_bytes: int) -> None:
        self.served.inc(size_bytes)
        self.figures["bytesServed"] += size_bytes


class PeerHoldings:
    """The verified pieces of fills under way (key -> (path, start, end))."""

    def __init__(self) -> None:
        self._pieces: dict[str, set[tuple[str, int, int]]] = {}

    def add(self, key: str, path: str, start: int, end: int) -> None:
        self._pieces.setdefault(key, set()).add((path, start, end))

    def has(self, key: str, path: str, start: int, end: int) -> bool:
        return (path, start, end) in self._pieces.get(key, ())

    def forget(self, key: str) -> None:
        self._pieces.pop(key, None)


@dataclass(frozen=True, slots=True)
class ServeLimits:
    serve_bps: float = 500e6
    max_uploads: int = 8
    # A piece its peer does not take at ``min_send_bps`` (after ``send_grace_s``) is abandoned
    # and its connection closed: a stalled peer must not hold an upload slot for ever.
    min_send_bps: float = 1e6
    send_grace_s: float = 10.0


_RANGE = re.compile(r"bytes=([0-9]{1,19})-([0-9]{1,19})", re.ASCII)


def _parse_range(header: str) -> tuple[int, int]:
    """``[start, end)`` of a single ``bytes=a-b`` range in ASCII digits (``int`` alone took
    other scripts' digits, ``+`` and ``_``)."""
    if not header:
        raise web.HTTPBadRequest(text="a single 'Range: bytes=first-last' is required")
    match = _RANGE.fullmatch(header.strip())
    if match is None:
        raise web.HTTPRequestRangeNotSatisfiable()
    start, end = int(match[1]), int(match[2]) + 1
    if end <= start:
        raise web.HTTPRequestRangeNotSatisfiable()
    return start, end


def _safe_rel(path: str) -> str:
    """``path`` if a manifest may name it (``check_relpath``: the same rule, so a peer never
    refuses a file of a model it holds), else 404."""
    try:
        check_relpath(path)
    except ManifestError:
        raise web.HTTPNotFound() from None
    return path


def _open_for_serving(path: Path) -> BinaryIO:
    """Open ``path`` with read-ahead off (``POSIX_FADV_RANDOM``): during a fill the pieces
    around a held one may still be written with ``O_DIRECT`` (``direct_io``), and read-ahead
    would cache their old (unwritten) bytes; so only the range sent is read into the page cache,
    and it is never written again."""
    fh = path.open("rb", buffering=0)
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
    return fh


class PeerServer:
    def __init__(
        self,
        store: Store,
        holdings: PeerHoldings,
        counters: PeerCounters,
        token: str | None,
        limits: ServeLimits,
    ) -> None:
        self._store = store
        self._holdings = holdings
        self._counters = counters
        self._token = token
        self._bucket = TokenBucket(MonotonicClock(), limits.serve_bps)
        self._slots = asyncio.Semaphore(limits.max_uploads)
        self._limits = limits

    def set_rate(self, serve_bps: float) -> None:
        if serve_bps != self._bucket.rate_bps:
            self._bucket = TokenBucket(MonotonicClock(), serve_bps)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(PIECE_ROUTE, self._piece)

    def _authorised(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        return self._token is not None and bearer_matches(header, self._token)

    def _locate(self, key: str, rel: str, start: int, end: int) -> Path:
        if len(key) != 64 or not all(c in "0123456789abcdef" for c in key):
            raise web.HTTPNotFound()
        if self._store.is_published(key):
            return self._store.object_dir(key) / rel
        if self._holdings.has(key, rel, start, end):
            return self._store.staging_dir(key) / rel
        raise web.HTTPNotFound()

    async def _piece(self, request: web.Request) -> web.StreamResponse:
        if not self._authorised(request):
            return web.json_response({"error": "the fleet's bearer token is required"}, status=401)
        key, rel = request.match_info["key"], _safe_rel(request.match_info["path"])
        start, end = _parse_range(request.headers.get("Range", ""))
        path = self._locate(key, rel, start, end)
        try:
            size_bytes = path.stat().st_size
        except OSError as err:  # published meanwhile, or gone
            raise web.HTTPNotFound() from err
        if size_bytes < end:  # RFC 9110: a 416 says the representation's length
            raise web.HTTPRequestRangeNotSatisfiable(
                headers={"Content-Range": f"bytes */{size_bytes}"}
            )
        async with self._slots:  # sent here (zero-copy ``sendfile``), within the bound
            delay_s = self._bucket.reserve(end - start)
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            try:
                fh = await asyncio.to_thread(_open_for_serving, path)
            except OSError as err:  # published meanwhile, or gone
                raise web.HTTPNotFound() from err
            with fh:
                resp = web.StreamResponse(status=206, headers={
                    "Content-Range": f"bytes {start}-{end - 1}/{size_bytes}",
                    "Content-Type": "application/octet-stream",
                })  # fmt: skip
                resp.content_length = end - start
                if request.method == "HEAD":  # the head only: no body may follow it
                    await resp.prepare(request)
                    await resp.write_eof()
                    return resp
                limits = self._limits
                timeout_s = limits.send_grace_s + (end - start) / limits.min_send_bps
                try:
                    await asyncio.wait_for(_send(request, resp, fh, start, end), timeout_s)
                except ConnectionResetError:  # the peer went away
                    return resp
                except TimeoutError:  # the peer stopped reading: free the slot
                    log.warning("peer piece %s/%s not taken in %.0f s: closed", key, rel, timeout_s)
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
            self._counters.serve(end - start)
            return resp


async def _send(
    request: web.Request, resp: web.StreamResponse, fh: BinaryIO, start: int, end: int
) -> None:
    """The head, then bytes ``[start, end)`` of ``fh`` by ``sendfile`` (copied through Python
    only where the transport cannot: ``loop.sendfile``'s fallback)."""
    await resp.prepare(request)  # a StreamResponse sends its head at once
    transport = request.transport
    if transport is None:
        raise ConnectionResetError("the peer went away")
    await asyncio.get_running_loop().sendfile(transport, fh, start, end - start)
    await resp.write_eof()
