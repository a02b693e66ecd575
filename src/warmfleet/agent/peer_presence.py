"""A node's standing at the tracker for the versions it serves once their fills are over.

The tracker takes a node it has not heard from for its stall bound for dead and offers it no
more (``control.tracker``), whatever it holds. A fill reports by itself, at least every
``renew_s`` (``peer_run``); once the fill is over the node still serves the version (staged
while the manager checks it, then published), so it says so: every ``renew_s`` (``Peers.
keep_offered``), one report per version served, in that fill's session and with nothing in it
(``want`` 0), which keeps its pieces offered. A version this node no longer serves (evicted,
unpublished, failed the manager's check, its fill cancelled) is left at the next round: a report
in a new session that holds nothing, after which the tracker forgets what this node held. The
agent's clean stop leaves every version at once (``leave_all``).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from warmfleet.agent.peer_run import Report

# ``PeerFill.ask``: (key, pieces, session, report, want) -> the tracker's answer, None if none.
Ask = Callable[[str, int, str, Report, int], Awaitable[dict[str, Any] | None]]


@dataclass
class Standing:
    """One version's session at the tracker."""

    pieces: int
    session: str
    filling: bool = True  # its fill reports by itself


class Presence:
    """The versions this node has a session for at the tracker; ``serves(key)``: whether the
    node still serves ``key`` (its fill over)."""

    def __init__(self, serves: Callable[[str], bool]) -> None:
        self._serves = serves
        self.versions: dict[str, Standing] = {}

    def filling(self, key: str, pieces: int, session: str) -> None:
        """A fill of ``key`` started in ``session`` (it replaces any earlier one there)."""
        self.versions[key] = Standing(pieces, session)

    def over(self, key: str, session: str) -> None:
        """That fill ended without leaving (done, or cancelled): the rounds answer for it."""
        standing = self.versions.get(key)
        if standing is not None and standing.session == session:
            standing.filling = False

    def left(self, key: str, session: str) -> None:
        """That fill left the tracker itself (it failed)."""
        standing = self.versions.get(key)
        if standing is not None and standing.session == session:
            del self.versions[key]

    async def renew(self, ask: Ask) -> bool:
        """One round: each version whose fill is over is renewed if served, else left. False
        if a renewal went unanswered (the tracker down: try again sooner)."""
        over = [(key, s) for key, s in self.versions.items() if not s.filling]
        answered = await asyncio.gather(*(self._renew(ask, key, s) for key, s in over))
        return all(answered)

    async def _renew(self, ask: Ask, key: str, standing: Standing) -> bool:
        if self.versions.get(key) is not standing:  # a new fill took over meanwhile
            return True
        if self._serves(key):
            return await ask(key, standing.pieces, standing.session, Report(), 0) is not None
        del self.versions[key]
        await _leave(ask, key, standing.pieces)
        return True

    async def leave_all(self, ask: Ask) -> None:
        """The agent stops: the tracker forgets what this node held, every version at once."""
        versions, self.versions = self.versions, {}
        await asyncio.gather(*(_leave(ask, key, s.pieces) for key, s in versions.items()))


async def _leave(ask: Ask, key: str, pieces: int) -> None:
    """A report in a new session that holds nothing (unanswered: the tracker's stall bound
    takes this node off within its bound anyway)."""
    await ask(key, pieces, secrets.token_hex(8), Report(), 0)
