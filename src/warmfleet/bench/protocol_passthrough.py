"""A floor for the HTTP plumbing: a pass-through proxy on uvloop protocols + httptools (what the
gateway's ``wire.py`` / ``upstream.py`` are built on), round robin over its upstreams, with no
routing, no metrics, no header handling beyond framing and no limits.

`make bench-peers` runs it beside ``aiohttp-passthrough`` (the issue's reference point) so the
cost of merely relaying HTTP in Python on this machine is measured in the same run as every
router: what a router adds above it is its own logic. Each read from an upstream is one write
to the client (the response head goes out with the first body bytes), as in the gateway.

    python -m warmfleet.bench.protocol_passthrough --port 8100 http://127.0.0.1:8001 ...

Prints its URL on stdout once listening; ``GET /health`` answers 200. Requests keep their
method and target; answers keep their status with its standard reason phrase.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import cast
from urllib.parse import urlsplit

import httptools

from warmfleet.bench.passthrough import run_proxy_cli
from warmfleet.gateway.http.messages import head_bytes

Addr = tuple[str, int]
_HEALTH = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
_BAD_GATEWAY = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _Upstream(asyncio.Protocol):
    """One pooled keep-alive connection to an upstream; relays one answer at a time."""

    def __init__(self, proxy: _Proxy, addr: Addr) -> None:
        self.proxy = proxy
        self.addr = addr
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.client: _Client | None = None
        self.started_s = 0.0
        self.content_type = b"application/json"
        self.chunked = False
        self.started = False
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(6, 1, 1)  # IPPROTO_TCP, TCP_NODELAY

    def send(self, client: _Client, request: bytes) -> None:
        assert self.transport is not None
        self.client, self.started_s = client, time.monotonic()
        self.content_type, self.chunked, self.started = b"application/json", False, False
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.fail()
            return
        if self.chunked and self.pending and self.client is not None:
            self._relay()

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: ARG002
        self.proxy.forget(self)
        self.fail()

    def fail(self) -> None:
        """The answer is lost: the client gets a 502 (or its stream is cut)."""
        client, self.client = self.client, None
        if self.transport is not None:
            self.transport.close()
        if client is not None:
            client.fail(answered=self.started)

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"content-type":
            self.content_type = value
        elif lower == b"transfer-encoding":
            self.chunked = True

    def on_body(self, body: bytes) -> None:
        self.pending.append(body)

    def on_message_complete(self) -> None:
        client, self.client = self.client, None
        if client is None:
            return
        body = b"".join(self.pending)
        self.pending.clear()
        status = self.parser.get_status_code()
        if not self.chunked:
            framing = b"Content-Length: %d\r\n\r\n" % len(body)
            client.finish(self._head_with(status, framing) + body)
        elif self.started:
            client.finish(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n")
        else:
            client.finish(self._head() + (b"%x\r\n%s\r\n" % (len(body), body) if body else b"")
                          + b"0\r\n\r\n")  # fmt: skip
        if self.parser.should_keep_alive():
            self.proxy.release(self)
        elif self.transport is not None:
            self.transport.close()

    def _head(self) -> bytes:
        return self._head_with(self.parser.get_status_code(), b"Transfer-Encoding: chunked\r\n\r\n")

    def _head_with(self, status: int, framing: bytes) -> bytes:
        """The gateway's status line (standard reason phrase) and Content-Type, then ``framing``."""
        return head_bytes(status, self.content_type.decode("latin-1"), None, framing)

    def _relay(self) -> None:
        assert self.client is not None
        body = b"".join(self.pending)
        self.pending.clear()
        chunk = b"%x\r\n%s\r\n" % (len(body), body)
        self.client.write(chunk if self.started else self._head() + chunk)
        self.started = True


class _Client(asyncio.Protocol):
    """One client connection: requests are answered in order, one at a time."""

    def __init__(self, proxy: _Proxy) -> None:
        self.proxy = proxy
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.queue: deque[tuple[bytes, bytes, bytes]] = deque()  # method, target, body
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(6, 1, 1)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.fail(answered=False)

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: ARG002
        self.transport = None

    def on_url(self, url: bytes) -> None:
        self.url = url
        self.body = []

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        method = self.parser.get_method()
        self.queue.append((method, self.url, b"".join(self.body)))
        if not self.busy:
            self._next()

    def _next(self) -> None:
        if not self.queue or self.transport is None:
            return
        method, url, body = self.queue.popleft()
        if url == b"/health":
            self.transport.write(_HEALTH)
            self._next()
            return
        self.busy = True
        self.proxy.forward(self, method, url, body)

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def finish(self, data: bytes) -> None:
        self.write(data)
        self.busy = False
        self._next()

    def fail(self, *, answered: bool) -> None:
        if self.transport is not None:
            if not answered:
                self.transport.write(_BAD_GATEWAY)
            self.transport.close()
        self.busy = False


class _Proxy:
    """Round robin over the upstreams, idle connections pooled per upstream."""

    def __init__(self, upstreams: Sequence[str], timeout_s: float) -> None:
        addrs = []
        for url in upstreams:
            parts = urlsplit(url)
            addrs.append((parts.hostname or "127.0.0.1", parts.port or 80))
        self.order: Iterator[Addr] = itertools.cycle(addrs)
        self.idle: dict[Addr, list[_Upstream]] = {addr: [] for addr in addrs}
        self.busy: set[_Upstream] = set()
        self.timeout_s = timeout_s

    def forward(self, client: _Client, method: bytes, url: bytes, body: bytes) -> None:
        addr = next(self.order)
        head = b"%s %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n" % (
            method,
            url,
            addr[0].encode(),
            addr[1],
        )
        request = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
        idle = self.idle[addr]
        if idle:
            self._send(idle.pop(), client, request)
        else:
            asyncio.get_running_loop().create_task(self._connect(addr, client, request))

    async def _connect(self, addr: Addr, client: _Client, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Upstream(self, addr), *addr), self.timeout_s
            )
        except (OSError, TimeoutError):
            client.fail(answered=False)
            return
        self._send(conn, client, request)

    def _send(self, conn: _Upstream, client: _Client, request: bytes) -> None:
        self.busy.add(conn)
        conn.send(client, request)

    def release(self, conn: _Upstream) -> None:
        self.busy.discard(conn)
        self.idle[conn.addr].append(conn)

    def forget(self, conn: _Upstream) -> None:
        self.busy.discard(conn)
        idle = self.idle.get(conn.addr)
        if idle is not None and conn in idle:
            idle.remove(conn)

    def expire(self, now_s: float) -> None:
        """Cut answers that took longer than the timeout (one sweep per second, no timers)."""
        for conn in [c for c in self.busy if now_s - c.started_s > self.timeout_s]:
            conn.fail()


async def serve(host: str, port: int, upstreams: Sequence[str], timeout_s: float) -> None:
    """Serve until cancelled."""
    loop = asyncio.get_running_loop()
    proxy = _Proxy(upstreams, timeout_s)
    server = await loop.create_server(lambda: _Client(proxy), host, port, backlog=1024)
    async with server:
        print(f"http://{host}:{server.sockets[0].getsockname()[1]}", flush=True)
        while True:
            await asyncio.sleep(1.0)
            proxy.expire(time.monotonic())


def main() -> None:
    run_proxy_cli(serve)


if __name__ == "__main__":
    main()
