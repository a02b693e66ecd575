"""A node's standing at the tracker for the versions it serves once their fills are over.

The tracker takes a node it has not heard from for its stall bound for dead and offers it no
more (``control.tracker``), whatever it holds. A fill reports by itself, at least every
``renew_s`` (``peer_run``); once the fill is over the node still serves the version (staged
while the manager checks it, then published), so it says so: every ``renew_s`` (``Peers.
keep_offered``), one report per version served, in that fill's session and with nothing in it
(``want`` 0), which keeps its pieces offered. A version this node no longer serves (evicted,
unpublished, failed the manager's check) is left at the next round: a report in a new session
that holds nothing, after which the tracker forgets what this node held. A version published
here that no fill of this agent reported (it was published before the agent restarted, or by
another process on this node) joins at the next round, every piece held (``adopt``). A
cancelled fill is left at once: ``cancelled`` wakes the rounds (``wake``), and the round it
wakes leaves it, served or not. The agent's clean stop leaves every version at once
(``leave_all``).

A round's report (a renewal in the old session, a leave in a new one) may still be on its way
when a new fill of the same version starts; reaching the tracker after that fill's first report,
it would switch the node's session there and back, and the tracker would forget the pieces that
fill had reported (reports are incremental). So a fill waits for them first (``settled``).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable, Collection, Iterator
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
    leaving: bool = False  # its fill was cancelled: left at the next round, served or not


class Presence:
    """The versions this node has a session for at the tracker."""

    def __init__(self) -> None:
        self.versions: dict[str, Standing] = {}
        self.wake = asyncio.Event()  # set: a version to leave now (``leave_cancelled``)
        self._sending: dict[str, set[asyncio.Future[None]]] = {}  # reports on their way

    def filling(self, key: str, pieces: int, session: str) -> None:
        """A fill of ``key`` started in ``session`` (it replaces any earlier one there); it
        awaited ``settled(key)`` first."""
        self.versions[key] = Standing(pieces, session)

    def over(self, key: str, session: str) -> None:
        """That fill ended without leaving (done, or cancelled): the rounds answer for it."""
        standing = self.versions.get(key)
        if standing is not None and standing.session == session:
            standing.filling = False

    def cancelled(self, key: str, session: str) -> None:
        """That fill was cancelled: it is left at once (the rounds are woken), served or not."""
        standing = self.versions.get(key)
        if standing is not None and standing.session == session:
            standing.filling, standing.leaving = False, True
            self.wake.set()

    def left(self, key: str, session: str) -> None:
        """That fill left the tracker itself (it failed)."""
        standing = self.versions.get(key)
        if standing is not None and standing.session == session:
            del self.versions[key]

    def ended(self) -> list[tuple[str, Standing]]:
        """The versions whose fills are over: a round renews or leaves each."""
        return [(key, s) for key, s in self.versions.items() if not s.filling]

    async def settled(self, key: str) -> None:
        """Until no report of ``key`` a round sent is on its way (each within its timeout)."""
        while sending := self._sending.get(key):
            await asyncio.wait(set(sending))

    async def renew(
        self, ask: Ask, ended: list[tuple[str, Standing]], served: Collection[str]
    ) -> bool:
        """One round over ``ended`` (``self.ended()`` when the round began): each version in
        ``served`` is renewed, the others are left (one a new fill took over meanwhile is not
        touched). False if a renewal went unanswered (the tracker down: try again sooner)."""
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(self._renew(ask, k, s, k in served)) for k, s in ended]
        return all(task.result() for task in tasks)

    async def adopt(self, ask: Ask, key: str, pieces: int) -> bool:
        """Join the tracker for ``key``, served here with every piece but unknown to it from
        this node (published before this agent started, or by another process): a new session
        holding all ``pieces``, renewed by the rounds from then on. False if unanswered."""
        if key in self.versions:
            return True
        session = secrets.token_hex(8)
        with self._sending_report(key):  # a fill of ``key`` starting now waits for it
            report = Report(have=list(range(pieces)))
            if await ask(key, pieces, session, report, 0) is None:
                return False
            self.versions.setdefault(key, Standing(pieces, session, filling=False))
        return True

    async def leave_cancelled(self, ask: Ask) -> None:
        """The round ``wake`` asks for: the versions whose fills were cancelled are left."""
        self.wake.clear()
        await self.renew(ask, [(k, s) for k, s in self.ended() if s.leaving], ())

    async def _renew(self, ask: Ask, key: str, standing: Standing, served: bool) -> bool:
        if self.versions.get(key) is not standing:  # a new fill took over meanwhile
            return True
        with self._sending_report(key):  # from here on, a new fill of ``key`` waits for it
            if served and not standing.leaving:
                return await ask(key, standing.pieces, standing.session, Report(), 0) is not None
            del self.versions[key]
            await _leave(ask, key, standing.pieces)
            return True

    async def leave_all(self, ask: Ask) -> None:
        """The agent stops: the tracker forgets what this node held, every version at once."""
        versions, self.versions = self.versions, {}
        async with asyncio.TaskGroup() as tg:
            for key, standing in versions.items():
                tg.create_task(self._leave_now(ask, key, standing.pieces))

    async def _leave_now(self, ask: Ask, key: str, pieces: int) -> None:
        with self._sending_report(key):
            await _leave(ask, key, pieces)

    @contextlib.contextmanager
    def _sending_report(self, key: str) -> Iterator[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sending.setdefault(key, set()).add(done)
        try:
            yield
        finally:
            done.set_result(None)
            sending = self._sending[key]
            sending.discard(done)
            if not sending:
                del self._sending[key]


async def _leave(ask: Ask, key: str, pieces: int) -> None:
    """A report in a new session that holds nothing (unanswered: the tracker's stall bound
    takes this node off within its bound anyway)."""
    await ask(key, pieces, secrets.token_hex(8), Report(), 0)
