"""One node agent's side of peer distribution: what it serves, how it fills, its figures.

Built by the agent's composition root (the embedded ``local.agent_proc``): ``server`` adds the
piece route to the status API app; ``configure`` takes the ``peers`` part of the fleet's
assignment (``{"tracker", "node", "url", "pieceBytes", "serveBps", "stallS", "renewS"}``;
absent: peer fills off; a ``renewS`` that is not a positive number: ValueError) and sets the
manager's ``fill_hook``. ``keep_offered`` (a task of the agent's, until its stop) renews, every
``renewS``, the versions this node serves once their fills are over, and leaves those it no
longer serves (what is served is read off the event loop, once per round), joins those
published here that the tracker does not know from this node (published before a restart)
with every piece, and leaves a cancelled fill's version at once (``Presence.wake``); at the
stop it leaves the tracker for every version (``peer_presence``). ``aclose`` closes its HTTP
session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import Any

import aiohttp

from warmfleet.agent.api_auth import ApiAuth
from warmfleet.agent.manager import CacheManager
from warmfleet.agent.peer_fill import PeerFill
from warmfleet.agent.peer_presence import Presence
from warmfleet.agent.peer_run import DEFAULT_RENEW_S, DEFAULT_STALL_S, PeerConfig
from warmfleet.agent.peer_serve import PeerCounters, PeerHoldings, PeerServer, ServeLimits
from warmfleet.cache.manifest import Manifest
from warmfleet.cache.pieces import DEFAULT_PIECE_BYTES, plan_pieces
from warmfleet.cache.state import ArtifactState
from warmfleet.core.errors import WarmfleetError

log = logging.getLogger("warmfleet.agent.peers")
CONFIG_POLL_S = 1.0  # how long a renewal round may wait on settings since changed


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
        self._fill: PeerFill | None = None
        self.presence = Presence()

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
            self._fill = None
            return
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64, limit_per_host=8)
            )
        self.server.set_rate(float(doc.get("serveBps") or ServeLimits().serve_bps))
        fill = PeerFill(config, self._session, self.holdings, self.counters, self.presence)
        self._manager.fill_hook = fill.hook
        self._fill = fill

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

    def _served(self, keys: list[str]) -> set[str]:
        """(Worker thread: the index is read under its lock.) Those of ``keys`` served here:
        published, or staged while the manager checks them after their fill (``VERIFYING``);
        the index read once at most."""
        store = self._manager.store
        out = {key for key in keys if store.is_published(key)}
        if len(out) < len(keys):
            index = store.read_index()
            for key in keys:
                rec = index.get(key)
                if rec is not None and rec.state == ArtifactState.VERIFYING:
                    out.add(key)
        return out

    async def keep_offered(self, stop: asyncio.Event) -> None:
        """Until ``stop``: a round of ``presence.renew`` every ``renewS`` (after one left
        unanswered, ``tracker_retry_s`` at most; the settings of the latest assignment, looked
        at every ``CONFIG_POLL_S``), and the cancelled fills left as soon as ``presence.wake``
        is set; then every version is left."""
        loop = asyncio.get_running_loop()
        last_s, retry = loop.time(), False
        while not stop.is_set():
            fill = self._fill  # None: peer fills off, nothing to keep up
            if self.presence.wake.is_set():
                if fill is None:
                    self.presence.wake.clear()
                else:
                    await self.presence.leave_cancelled(fill.ask)
                continue
            delay_s = DEFAULT_RENEW_S if fill is None else fill.config.renew_s
            if retry and fill is not None:
                delay_s = min(delay_s, fill.config.tracker_retry_s)
            wait_s = last_s + delay_s - loop.time()
            if wait_s > 0:
                await _wait_either(stop, self.presence.wake, min(wait_s, CONFIG_POLL_S))
                continue
            last_s = loop.time()
            retry = fill is not None and await self._round(fill)
        if self._fill is not None:
            await self.presence.leave_all(self._fill.ask)

    async def _round(self, fill: PeerFill) -> bool:
        """One round: the versions served here but unknown to the tracker from this node
        joined, then the renewals; True if it should be tried again sooner."""
        ended = self.presence.ended()  # (a version joined in this round is not renewed in it)
        try:  # what is served is read off the event loop, once for the round
            known = set(self.presence.versions)
            unknown = await asyncio.to_thread(self._unoffered, known, fill.config.piece_bytes)
            joined = [await self.presence.adopt(fill.ask, k, n) for k, n in unknown.items()]
            if not ended:
                return not all(joined)
            served = await asyncio.to_thread(self._served, [key for key, _ in ended])
            return not (await self.presence.renew(fill.ask, ended, served) and all(joined))
        except (OSError, WarmfleetError) as err:  # the cache index unreadable, for one
            log.warning("peer renewals: %s", err)
            return True

    def _unoffered(self, known: set[str], piece_bytes: int) -> dict[str, int]:
        """(Worker thread.) The published versions not in ``known``, each with its number of
        pieces (none of an empty version, or of one whose marker is unreadable: the manager's
        check answers for those)."""
        store, found = self._manager.store, {}
        for key in store.published_keys():
            if key in known:
                continue
            try:
                manifest = Manifest.from_json(store.read_marker(key)["manifest"])
            except (WarmfleetError, KeyError, TypeError, ValueError) as err:
                log.debug("peer renewals: %s not offered: %s", key[:16], err)
                continue
            if pieces := len(plan_pieces(manifest, piece_bytes)):
                found[key] = pieces
        return found

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


async def _wait_either(stop: asyncio.Event, wake: asyncio.Event, wait_s: float) -> None:
    """Until ``stop`` or ``wake`` is set, ``wait_s`` at most."""
    tasks: list[asyncio.Task[None]] = []

    async def until(event: asyncio.Event) -> None:
        await event.wait()
        for task in tasks:  # the other one
            if task is not asyncio.current_task():
                task.cancel()

    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(wait_s), asyncio.TaskGroup() as tg:
            tasks += [tg.create_task(until(stop)), tg.create_task(until(wake))]
