"""Pooled upstream connections (``upstream.UpstreamConnection``) per instance address: at most
``max_connections`` open (a request waits for a free one at most ``connect_timeout_s``, then
``UpstreamPoolTimeout``), idle ones reused most recently used first and swept after
``keepalive_s``, one ticker for every exchange's timeouts."""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable
from time import monotonic

from warmfleet.gateway.http.upstream import (
    Addr,
    UpstreamConnectError,
    UpstreamConnection,
)


class UpstreamPoolTimeout(Exception):
    """No connection came free within the connect timeout: all ``max_connections`` are busy
    (the gateway's own limit, not a failure of the instance)."""


class UpstreamPool:
    """Connections per instance address; at most ``max_connections`` open (0 = unlimited)."""

    def __init__(
        self, connect_timeout_s: float, max_connections: int = 0, keepalive_s: float = 60.0
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.max_connections = max_connections
        self.keepalive_s = keepalive_s
        self.idle: dict[Addr, deque[UpstreamConnection]] = {}
        self.open: set[UpstreamConnection] = set()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._ticker: asyncio.TimerHandle | None = None
        self._tick_s = 0.0
        self._connecting = 0

    def set_limits(self, connect_timeout_s: float, max_connections: int) -> None:
        """New limits (a config reload) for the next connections and waiters."""
        self.connect_timeout_s = connect_timeout_s
        self.max_connections = max_connections
        waiters, self._waiters = self._waiters, deque()
        for waiter in waiters:  # each checks the new limit again (and waits again if over)
            if not waiter.done():
                waiter.set_result(None)

    def watch(self, timeout_s: float) -> None:
        """Make sure exchange timeouts are checked often enough for ``timeout_s`` (a quarter
        of it, at most every 0.25 s). One ticker for the pool: a timer per exchange costs the
        gateway ~10 % of its CPU."""
        tick_s = max(0.01, min(0.25, timeout_s / 4))
        if self._ticker is not None and tick_s >= self._tick_s:
            return
        if self._ticker is not None:
            self._ticker.cancel()
        self._tick_s = tick_s
        self._ticker = asyncio.get_running_loop().call_later(tick_s, self._tick)

    def _tick(self) -> None:
        self._ticker = None
        now = monotonic()
        busy = False
        for conn in list(self.open):
            conn.check_timeout(now)
            busy = busy or conn.exchange is not None
        if busy:
            self._ticker = asyncio.get_running_loop().call_later(self._tick_s, self._tick)

    def take_idle(self, addr: Addr) -> UpstreamConnection | None:
        """An open idle connection to ``addr``, without waiting; ``None`` if there is none."""
        idle = self.idle.get(addr)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        return None

    async def acquire(self, addr: Addr) -> UpstreamConnection:
        """An idle connection to ``addr``, else a new one; at ``max_connections``, the first
        to come free (waited for at most ``connect_timeout_s``: ``UpstreamPoolTimeout``), and
        the connect is bounded by ``connect_timeout_s`` too (``UpstreamConnectError``)."""
        conn = self.take_idle(addr)
        if conn is not None:
            return conn
        if self._full():
            wait_s = self.connect_timeout_s
            try:
                async with asyncio.timeout(wait_s):
                    conn = await self._wait_for_room(addr)
            except TimeoutError as err:
                limit = self.max_connections
                raise UpstreamPoolTimeout(
                    f"all {limit} upstream connections (maxUpstreamConnections) stayed busy "
                    f"for {wait_s:g} s"
                ) from err
            if conn is not None:
                return conn
        return await self._connect(addr)

    def _full(self) -> bool:
        limit = self.max_connections
        return bool(limit) and len(self.open) + self._connecting >= limit

    async def _wait_for_room(self, addr: Addr) -> UpstreamConnection | None:
        """Until a connection to ``addr`` is idle (it) or one may be opened (``None``)."""
        while self._full():
            if self._evict_idle():
                continue
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:  # the client left, or the wait timed out
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, then cancelled: pass the wake-up on
                else:
                    waiter.cancel()
                raise
            conn = self.take_idle(addr)
            if conn is not None:
                return conn
        return None

    async def _connect(self, addr: Addr) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        factory: Callable[[], UpstreamConnection] = lambda: UpstreamConnection(self, addr)  # noqa: E731
        tls = ssl.create_default_context() if addr[2] else None
        self._connecting += 1
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(factory, addr[0], addr[1], ssl=tls)
        except TimeoutError as err:
            raise UpstreamConnectError(f"connect to {addr[0]}:{addr[1]} timed out") from err
        except OSError as err:
            raise UpstreamConnectError(f"connect to {addr[0]}:{addr[1]} failed: {err}") from err
        finally:
            self._connecting -= 1
            self._wake()
        self.open.add(conn)
        return conn

    def release(self, conn: UpstreamConnection) -> None:
        if conn.closed:
            return
        conn.idle_since = monotonic()
        self.idle.setdefault(conn.addr, deque()).append(conn)
        self._wake()

    def forget(self, conn: UpstreamConnection) -> None:
        if conn in self.open:
            self.open.discard(conn)
            self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _evict_idle(self) -> bool:
        for queue in self.idle.values():
            while queue:
                conn = queue.popleft()
                if not conn.closed:
                    conn.close()
                    return True
        return False

    def sweep(self) -> None:
        """Close connections idle for longer than ``keepalive_s``."""
        cutoff = monotonic() - self.keepalive_s
        for queue in self.idle.values():
            while queue and (queue[0].closed or queue[0].idle_since < cutoff):
                queue.popleft().close()

    def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        for conn in list(self.open):
            conn.abort()
        self.idle.clear()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.cancel()
        self._waiters.clear()
