"""Fault injectors for peer fills: peers that serve flipped bytes or stall mid-piece.

A ``BadPeer`` is an HTTP server on 127.0.0.1 answering the agents' piece route
(``/v1/peer/{key}/{path}`` with a ``Range``) from the origin's own files on disk (so it costs no
origin egress): ``flip`` sends the right number of bytes with one byte inverted, ``stall``
sends half the piece and then nothing for ``hold_s``. ``advertise`` tells the embedded fleet's
tracker that it holds every piece of every version it knows, so planners offer it to the
filling nodes. Test-side only: nothing here is in the installed package.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from warmfleet.control.tracker import PlanRequest, Tracker


@dataclass
class BadPeer:
    name: str
    kind: str  # "flip" | "stall"
    files: Path  # the origin's directory: the bytes to corrupt
    hold_s: float = 10.0
    requests: int = 0
    url: str = ""
    _runner: web.AppRunner | None = field(default=None, repr=False)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/v1/peer/{key}/{path:.+}", self._piece)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _piece(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        first, _, last = request.headers["Range"].removeprefix("bytes=").partition("-")
        start, end = int(first), int(last) + 1
        path = self.files / Path(request.match_info["path"]).name
        with path.open("rb") as fh:
            fh.seek(start)
            data = bytearray(fh.read(end - start))
        resp = web.StreamResponse(status=206, headers={"Content-Length": str(len(data))})
        await resp.prepare(request)
        try:
            if self.kind == "flip":
                data[len(data) // 2] ^= 0xFF
                await resp.write(bytes(data))
            else:
                await resp.write(bytes(data[: len(data) // 2]))
                await asyncio.sleep(self.hold_s)
        except ConnectionResetError:
            pass
        return resp


def advertise(tracker: Tracker, peers: list[BadPeer]) -> int:
    """Claim every piece of every known version for each peer; returns the versions seen."""
    for version in tracker.versions.values():
        for peer in peers:
            everything = tuple(range(version.pieces))
            version.plan(PlanRequest(peer.name, peer.url, peer.name, have=everything))
    return len(tracker.versions)
