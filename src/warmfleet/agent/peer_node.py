"""One node agent's side of peer distribution: what it serves, how it fills, its figures.

Built by the agent's composition root (the embedded ``local.agent_proc``): ``server`` adds the
piece route to the status API app; ``configure`` takes the ``peers`` part of the fleet's
assignment (``{"tracker", "node", "url", "pieceBytes", "serveBps", "stallS", "renewS"}``;
absent: peer fills off; a ``renewS`` that is not a positive number: ValueError) and sets the
manager's ``fill_hook``. ``aclose`` closes its HTTP session.
"""

from __future__ import annotations

import math
from typing import Any

import aiohttp

from warmfleet.agent.api_auth import ApiAuth
from warmfleet.agent.manager import CacheManager
from warmfleet.agent.peer_fill import PeerFill
from warmfleet.agent.peer_run import DEFAULT_RENEW_S, DEFAULT_STALL_S, PeerConfig
from warmfleet.agent.peer_serve import PeerCounters, PeerHoldings, PeerServer, ServeLimits
from warmfleet.cache.pieces import DEFAULT_PIECE_BYTES


class Peers:
    def __init__(self, manager: CacheManager) -> None:
        self._manager = manager
        self._token = ApiAuth.from_spec(manager.spec.status).token
        self.holdings = PeerHoldings()
        self.counters = PeerCounters(manager.metrics.registry)
        self.server = PeerServer(
            manager.store, self.holdings, self.counters, self._token, ServeLimits()
        )
        self._session: aiohttp.ClientSession | None = None
        self._config: PeerConfig | None = None

    @property
    def figures(self) -> dict[str, int]:
        return dict(self.counters.figures)

    def configure(self, doc: Any) -> None:
        config = self._parse(doc)
        if config == self._config:
            return
        self._config = config
        if config is None:
            self._manager.fill_hook = None
            return
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64, limit_per_host=8)
            )
        self.server.set_rate(float(doc.get("serveBps") or ServeLimits().serve_bps))
        fill = PeerFill(config, self._session, self.holdings, self.counters)
        self._manager.fill_hook = fill.hook

    def _parse(self, doc: Any) -> PeerConfig | None:
        if not isinstance(doc, dict) or not doc.get("tracker") or self._token is None:
            return None
        download = self._manager.spec.download  # an origin piece's slow-body guard
        return PeerConfig(
            tracker_url=str(doc["tracker"]),
            node=str(doc["node"]),
            self_url=str(doc["url"]),
            token=self._token,
            piece_bytes=int(doc.get("pieceBytes") or DEFAULT_PIECE_BYTES),
            stall_s=float(doc.get("stallS") or DEFAULT_STALL_S),
            renew_s=_renew_s(doc.get("renewS")),
            origin_min_bps=float(download.min_download_rate_bytes_per_s),
            origin_low_speed_s=download.low_speed_time_s,
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _renew_s(value: Any) -> float:
    """The assignment's ``renewS`` (absent: the default); not a positive finite number: a
    ValueError naming it (the fleet's config refuses such a value at load)."""
    if value is None:
        return DEFAULT_RENEW_S
    renew_s = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0
    if not (math.isfinite(renew_s) and renew_s > 0):
        raise ValueError(f"peers.renewS must be a positive number of seconds, got {value!r}")
    return renew_s
