"""The gateway's listening side: sockets, the one timeout ticker for every connection, and the
graceful stop. Each connection is a ``wire.ServerConnection``."""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections import deque
from time import monotonic
from typing import Any

from warmfleet.gateway.http.access_log import AccessLog
from warmfleet.gateway.http.messages import ErrorFactory, Handler, ServerLimits
from warmfleet.gateway.http.wire import ServerConnection


def default_max_connections() -> int:
    """Half the process's open-file limit (at least 16): past the limit ``accept`` fails and
    the listener stops taking anyone, so the gateway must refuse before it gets there."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 16
    return max(16, soft // 2)


class HttpServer:
    """Listening sockets and their connections; ``handler`` answers every request;
    ``access_log``: a line per answered request (None: off); ``max_connections``: clients
    held at once (0: ``default_max_connections``)."""

    def __init__(
        self,
        handler: Handler,
        limits: ServerLimits,
        error: ErrorFactory,
        max_connections: int = 0,
    ) -> None:
        self.handler = handler
        self.limits = limits
        self.error = error
        self.access_log: AccessLog | None = None
        self.connections: set[ServerConnection] = set()
        self.max_connections = max_connections or default_max_connections()
        self.refused_connections = 0  # at the cap with no idle connection to close
        self.buffered_body_bytes = 0  # bodies of all connections still being received
        self.held: deque[ServerConnection] = deque()  # not read while over that budget
        self._server: asyncio.AbstractServer | None = None
        self._ticker: asyncio.TimerHandle | None = None

    @property
    def tick_s(self) -> float:
        """Timeouts are checked every tick: they fire up to a quarter of their value late."""
        limits = self.limits
        return max(0.01, min(1.0, limits.body_read_timeout_s / 4, limits.keepalive_timeout_s / 4))

    def set_limits(
        self, max_body_bytes: int, body_read_timeout_s: float, max_buffered_body_bytes: int
    ) -> None:
        """New limits for the next requests of every connection (a config reload)."""
        self.limits.max_body_bytes = max_body_bytes
        self.limits.body_read_timeout_s = body_read_timeout_s
        self.limits.max_buffered_body_bytes = max_buffered_body_bytes
        self.release_held()

    def release_held(self) -> None:
        """Read again from connections held over the body budget, while it has room (one
        read each at most goes over it before a connection is held again)."""
        held = self.held
        while held and self.buffered_body_bytes < self.limits.max_buffered_body_bytes:
            held.popleft().unhold()

    def admit(self, conn: ServerConnection) -> bool:
        """Room for a new client: at the cap, the connection idle the longest is closed for it;
        False when every connection is busy (the caller refuses the newcomer)."""
        connections = self.connections
        if len(connections) < self.max_connections:
            connections.add(conn)
            return True
        idle = [c for c in connections if c.idle and not c.closed]
        if not idle:
            self.refused_connections += 1
            return False
        oldest = min(idle, key=lambda c: c.idle_since)
        # Output its client never reads would keep it open (``close`` waits for it to drain),
        # and an evicted connection is not one the ticker drops in time: abort it.
        transport = oldest.transport
        if transport is not None and transport.get_write_buffer_size():
            transport.abort()
        oldest.close()
        connections.discard(oldest)  # closing: no longer counts, its FIN is on its way
        connections.add(conn)
        return True

    async def start(self, host: str, port: int, backlog: int = 1024) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ServerConnection(self), host, port, backlog=backlog, reuse_address=True
        )
        sock: Any = self._server.sockets[0]
        self._ticker = loop.call_later(self.tick_s, self._tick)
        return int(sock.getsockname()[1])

    def _tick(self) -> None:
        now = monotonic()
        for conn in list(self.connections):
            conn.check_timers(now)
        self._ticker = asyncio.get_running_loop().call_later(self.tick_s, self._tick)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let requests in progress finish (up to ``grace_s``), then close."""
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if self._server is not None:
            self._server.close()
        deadline = monotonic() + grace_s
        while any(c.busy for c in self.connections) and monotonic() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn.transport is not None:
                busy = conn.busy or conn.closed  # closed: flushing or lingering
                conn.transport.abort() if busy else conn.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=grace_s)
            self._server = None
        await asyncio.sleep(0)
