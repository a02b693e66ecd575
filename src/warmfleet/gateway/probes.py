"""The gateway's own reads of its instances: the health probes (``gateway.health``), the
``/v1/models`` answers (``gateway.openai.models``) and the engines' ``/metrics``
(``gateway.kv_capacity``, ``gateway.engine_stats``).

Each reader has a connection pool of its own (``probe_session``: never the request path's nor
another reader's), bounded to its share of ``READ_SLOTS`` (``ReaderPools``), and a ``Prober``
over it that lets at most that many of its reads in flight at once. The shares add up to
``MAX_BACKGROUND_READS``: with every instance hung, the four readers hold at most that many
sockets at once, and a reader whose reads hang holds its own share only (hung ``/v1/models``
never delays a health probe). A read's timeout starts once it has its slot: it covers the
read's own exchange only, so instances whose paths hang, holding every slot of their reader for
their timeout, delay that reader's other reads but never fail them (waiting for a slot is not
the instance's time).

The health probes and the engine-stats reads (every interval, up to 20 a second per engine)
keep their connections ``KEEPALIVE_S``; the models cache (at most once per ``modelsCacheTtlS``,
10 s by default) and the KV capacity reads (every 10 min per engine) close each connection after
its read, so an idle gateway keeps at most two sockets per instance for its own reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import ClientResponse, ClientSession, ClientTimeout, DummyCookieJar, TCPConnector

# Reads in flight at once, per reader (and the size of its pool): the health probes the largest
# share (a probe missed is an instance ejected), then the engine-stats reads (routing reads
# their figures), the rarer reads the least.
READ_SLOTS = {"health": 160, "engine_stats": 96, "models": 32, "kv_capacity": 32}
# All the readers' reads in flight at once: the sockets they hold at worst.
MAX_BACKGROUND_READS = sum(READ_SLOTS.values())
# How long the health probes' and engine-stats reads' pools keep an idle connection.
KEEPALIVE_S = 60.0


def probe_session(slots: int, *, keepalive: bool = True) -> ClientSession:
    """A reader's own pool of at most ``slots`` connections (its ``Prober`` lets no more reads
    in flight); without ``keepalive``, each connection is closed after its read."""
    if keepalive:
        connector = TCPConnector(limit=slots, keepalive_timeout=KEEPALIVE_S)
    else:
        connector = TCPConnector(limit=slots, force_close=True)
    return ClientSession(connector=connector, cookie_jar=DummyCookieJar())


@dataclass(frozen=True)
class ReaderPools:
    """The four readers' pools (``READ_SLOTS`` each), opened together, closed together."""

    health: ClientSession
    models: ClientSession
    kv_capacity: ClientSession
    engine_stats: ClientSession

    @classmethod
    def open(cls) -> ReaderPools:
        return cls(
            health=probe_session(READ_SLOTS["health"]),
            models=probe_session(READ_SLOTS["models"], keepalive=False),
            kv_capacity=probe_session(READ_SLOTS["kv_capacity"], keepalive=False),
            engine_stats=probe_session(READ_SLOTS["engine_stats"]),
        )

    def sessions(self) -> list[ClientSession]:
        return [self.health, self.models, self.kv_capacity, self.engine_stats]


def probe_slots(session: ClientSession) -> int:
    """How many reads may be in flight at once on ``session``: as many as its connector holds (a
    read would wait for a connection inside its timeout), at most ``MAX_BACKGROUND_READS`` (an
    unlimited pool, as tests pass)."""
    limit = session.connector.limit if session.connector is not None else 0
    return min(limit, MAX_BACKGROUND_READS) if limit > 0 else MAX_BACKGROUND_READS


class Prober:
    """One reader's reads on ``session``, each timed from when it has its slot."""

    def __init__(self, session: ClientSession) -> None:
        self.session = session
        self._slots = asyncio.Semaphore(probe_slots(session))

    @asynccontextmanager
    async def get(self, url: str, timeout_s: float) -> AsyncIterator[ClientResponse]:
        """``GET url`` once a slot is free; ``timeout_s`` bounds the exchange, the body's
        reading inside the ``async with`` included. Raises what ``session.get`` raises."""
        async with self._slots:
            timeout = ClientTimeout(total=timeout_s)
            async with self.session.get(url, timeout=timeout) as resp:
                yield resp
