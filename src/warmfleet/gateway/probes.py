"""The gateway's own reads of its instances: the health probes (``gateway.health``), the
``/v1/models`` answers (``gateway.openai.models``) and the engines' ``/metrics``
(``gateway.kv_capacity``, ``gateway.engine_stats``).

Each reader has a connection pool of its own (``probe_session``, unlimited: never the request
path's nor another reader's) and a ``Prober`` over it that lets at most
``MAX_CONCURRENT_PROBES`` of its reads in flight at once (never more than its pool holds). A
read's timeout starts once it has its slot: it covers the read's own exchange only, so
instances whose paths hang, holding every slot for their timeout, delay the other reads but
never fail them (waiting for a slot, or for a pool connection, is not the instance's time).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import ClientResponse, ClientSession, ClientTimeout, DummyCookieJar, TCPConnector

# Reads in flight at once, per reader: a bound on the sockets a round opens, well above the
# fleets a reader's own pool serves at once.
MAX_CONCURRENT_PROBES = 256


def probe_session() -> ClientSession:
    """A reader's own pool, unlimited (its ``Prober`` bounds its reads)."""
    connector = TCPConnector(limit=0, keepalive_timeout=60.0)
    return ClientSession(connector=connector, cookie_jar=DummyCookieJar())


def probe_slots(session: ClientSession) -> int:
    """How many reads may be in flight at once on ``session``: never more than its connector
    holds (a read would wait for a connection inside its timeout)."""
    limit = session.connector.limit if session.connector is not None else 0
    return min(limit, MAX_CONCURRENT_PROBES) if limit > 0 else MAX_CONCURRENT_PROBES


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
