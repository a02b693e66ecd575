"""The peer route's upload slots: a peer that stops reading gives its slot back."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from warmfleet.agent.peer_serve import PeerCounters, PeerHoldings, PeerServer, ServeLimits
from warmfleet.agent.store import MARKER, Store

TOKEN = "peer-token-peer-token"
KEY = "ab" * 32
PIECE_BYTES = 48 << 20  # more than loopback's socket buffers hold


async def test_a_peer_that_stops_reading_frees_its_upload_slot(tmp_path: Path) -> None:
    store = Store(tmp_path)
    target = store.object_dir(KEY)
    target.mkdir(parents=True)
    with (target / "w.bin").open("wb") as fh:
        fh.truncate(PIECE_BYTES)
    (target / MARKER).write_text("{}")
    limits = ServeLimits(max_uploads=1, min_send_bps=1e12, send_grace_s=0.5)
    server = PeerServer(store, PeerHoldings(), PeerCounters(CollectorRegistry()), TOKEN, limits)
    app = web.Application()
    server.add_routes(app)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    stalled = socket.socket()
    try:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await asyncio.to_thread(stalled.connect, ("127.0.0.1", port))
        stalled.sendall(
            f"GET /v1/peer/{KEY}/w.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Range: bytes=0-{PIECE_BYTES - 1}\r\n\r\n".encode()
        )  # and never reads: the only slot is held until the send gives up
        await asyncio.sleep(0.2)
        headers = {"Authorization": f"Bearer {TOKEN}", "Range": "bytes=0-9"}
        url = f"http://127.0.0.1:{port}/v1/peer/{KEY}/w.bin"
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http,
            http.get(url, headers=headers) as resp,
        ):
            assert resp.status == 206
            assert await resp.read() == b"\0" * 10
    finally:
        stalled.close()
        await runner.cleanup()
