"""What the peer-fill tests share: node agents' peer routes served on loopback, joining them
to a tracker host, and an origin whose bodies wait to be released."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from warmfleet.agent.manager import CacheManager
from warmfleet.agent.peer_node import Peers
from warmfleet.cache.manifest import FileEntry, SourceKind
from warmfleet.local.tracker_host import TrackerHost

TOKEN = "fleet-token-for-peers"
PIECE = 256 * 1024


@contextlib.asynccontextmanager
async def serving(manager: CacheManager) -> AsyncIterator[tuple[Peers, str]]:
    """``manager``'s peer routes on 127.0.0.1: (its peers, its URL)."""
    peers = Peers(manager)
    app = web.Application()
    peers.server.add_routes(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield peers, f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
        await peers.aclose()


def join(peers: Peers, host: TrackerHost, node: str, url: str) -> None:
    peers.configure(
        {"tracker": host.url, "node": node, "url": url, "pieceBytes": PIECE, "stallS": 1.0}
    )


class HeldOrigin:
    """An origin whose bodies wait for ``release``; counts the GETs (``opened``)."""

    kind = SourceKind.HTTP

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.opened = 0
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def open_range(self, entry: FileEntry, start: int, end: int) -> AsyncIterator[bytes]:
        self.opened += 1
        self.started.set()
        await self.release.wait()
        yield self.data[start:end]
