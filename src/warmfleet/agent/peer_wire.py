"""The receiving end of a peer piece: one ranged GET over plain HTTP/1.1, its body received
straight into a buffer the fill reuses (``sock_recv_into``), not through aiohttp's chunk objects.

A peer fill moves every byte of a model version through this, so the per-byte cost is what
matters: the body is copied once, from the socket into the caller's buffer, with no Python
object per chunk and no join (aiohttp's ``readexactly`` made one ``bytes`` per received chunk
and copied them again into the piece). The request is the one ``PeerServer`` answers
(``Authorization: Bearer``, one ``Range``), on a connection of its own (``Connection: close``).

Failures raise ``PeerFailedError``: ``rejected`` when the peer answered but with the wrong length
or range (a bad peer), not when it refused, stalled (no byte for ``stall_s``), went away or sent
a short body. Plain ``http://`` only: the agents' status API port serves no TLS (a peer URL of
another scheme fails like an unreachable peer).
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from warmfleet.core.errors import CacheError

MAX_HEAD_BYTES = 64 << 10


class PeerFailedError(CacheError):
    """A peer refused, stalled, went away, or answered wrongly (``rejected``: a bad peer, whose
    answer or piece was wrong; the peer fill raises it too for a piece that fails its hash)."""

    def __init__(self, message: str, *, rejected: bool) -> None:
        super().__init__(message)
        self.rejected = rejected


@dataclass(frozen=True, slots=True)
class RangeGet:
    base_url: str  # the peer: http://host:port
    path: str  # the route, unquoted: /v1/peer/{key}/{file}
    start: int
    end: int  # exclusive
    token: str

    def request(self, host: str) -> bytes:
        return (
            f"GET {quote(self.path)} HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {self.token}\r\nRange: bytes={self.start}-{self.end - 1}\r\n"
            "Accept-Encoding: identity\r\nConnection: close\r\n\r\n"
        ).encode("latin-1")


async def get_into(get: RangeGet, buf: memoryview, *, stall_s: float, timeout_s: float) -> None:
    """Receive the body of ``get`` (exactly ``end - start`` bytes) into ``buf[:end - start]``."""
    parts = urlsplit(get.base_url)
    if parts.scheme != "http" or not parts.hostname:
        raise PeerFailedError(f"{get.base_url}: not a plain http:// peer", rejected=False)
    host, port = parts.hostname, parts.port or 80
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            family, kind, proto, _, addr = infos[0]
            with socket.socket(family, kind, proto) as sock:
                sock.setblocking(False)
                async with asyncio.timeout(stall_s) as stall:
                    await loop.sock_connect(sock, addr)
                    await loop.sock_sendall(sock, get.request(f"{host}:{port}"))
                    await _receive(loop, sock, get, buf, stall, stall_s)
    except TimeoutError as err:
        message = f"{get.base_url}: no byte for {stall_s} s or over {timeout_s} s"
        raise PeerFailedError(message, rejected=False) from err
    except OSError as err:
        raise PeerFailedError(f"{get.base_url}: {err!r}", rejected=False) from err


async def _receive(  # noqa: PLR0917
    loop: asyncio.AbstractEventLoop,
    sock: socket.socket,
    get: RangeGet,
    buf: memoryview,
    stall: asyncio.Timeout,
    stall_s: float,
) -> None:
    size_bytes = get.end - get.start
    head, body = await _head(loop, sock, stall, stall_s)
    _check_head(get, head)
    if len(body) > size_bytes:
        raise PeerFailedError(f"{get.base_url}: more than {size_bytes} bytes", rejected=True)
    buf[: len(body)] = body
    got = len(body)
    while got < size_bytes:
        stall.reschedule(loop.time() + stall_s)
        n = await loop.sock_recv_into(sock, buf[got:size_bytes])
        if n == 0:
            message = f"{get.base_url}: body ended at {got} of {size_bytes} bytes"
            raise PeerFailedError(message, rejected=False)
        got += n


async def _head(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, stall: asyncio.Timeout, stall_s: float
) -> tuple[bytes, bytes]:
    """The response head (status line and headers) and the body bytes received with it."""
    data = b""
    while (end := data.find(b"\r\n\r\n")) < 0:
        if len(data) > MAX_HEAD_BYTES:
            raise PeerFailedError("response head too long", rejected=True)
        stall.reschedule(loop.time() + stall_s)
        more = await loop.sock_recv(sock, 16 << 10)
        if not more:
            raise PeerFailedError("connection closed before the response head", rejected=False)
        data += more
    return data[:end], data[end + 4 :]


def _check_head(get: RangeGet, head: bytes) -> None:
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split(" ", 2)
    if len(status) < 2 or not status[0].startswith("HTTP/1."):
        raise PeerFailedError(f"{get.base_url}: not an HTTP/1.x answer", rejected=True)
    if status[1] != "206":
        raise PeerFailedError(f"{get.base_url}: HTTP {status[1]}", rejected=False)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    size_bytes = get.end - get.start
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise PeerFailedError(
            f"{get.base_url}: chunked body, not {size_bytes} bytes", rejected=True
        )
    if headers.get("content-length") != str(size_bytes):
        announced = headers.get("content-length")
        message = f"{get.base_url}: {announced} bytes announced, not {size_bytes}"
        raise PeerFailedError(message, rejected=True)
    content_range = headers.get("content-range")
    if content_range is not None and not content_range.startswith(
        f"bytes {get.start}-{get.end - 1}/"
    ):
        raise PeerFailedError(f"{get.base_url}: sent {content_range!r}", rejected=True)
