"""``Inbound``: when a replica reads and applies the batches its peers sent (docs/replicas.md,
"Applying").

A batch waiting on the SUB socket is read and applied before this replica's next routing
decision (``drain``, from the variant's snapshot) or ``apply_delay_s`` after the socket first
signalled, whichever comes first. A decision never uses a state older than what had arrived;
a replica that routes nothing (a standby, or one the load balancer passes over) wakes once per
delay for every batch that came meanwhile and applies them in one go, instead of waking for
each batch with cold caches. A delay of 0 reads each batch as soon as it arrives.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from warmfleet.gateway.replica_sync.transport import RECEIVE_BURST, Sockets

log = logging.getLogger(__name__)


class Inbound:
    """``on_message(message, arrived_s)``: ``arrived_s`` is when the socket signalled (wall
    clock) for the first batch read after a signal, which arrived then; ``None`` for the others,
    which came between the signal and the read."""

    def __init__(
        self,
        sockets: Sockets,
        on_message: Callable[[bytes, float | None], None],
        apply_delay_s: float,
        wall: Callable[[], float],
    ) -> None:
        self._sockets = sockets
        self._on_message = on_message
        self._delay_s = apply_delay_s
        self._wall = wall
        self._signalled_s: float | None = None  # wall clock, until the first batch is read
        self._fd = sockets.sub_fd
        self._loop: asyncio.AbstractEventLoop | None = None
        # ``remove_reader`` typed ``-> bool``: uvloop's gives None, which compiled code refuses
        self._unwatch: Callable[[int], object] = lambda _fd: None
        self._later: asyncio.Handle | None = None  # the read that is due, while ``waiting``
        self.waiting = False  # the socket signalled and was not read since

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch the SUB socket's descriptor (ZeroMQ's edge-triggered signal: reading the
        socket's state re-arms it)."""
        self._loop = loop
        self._unwatch = loop.remove_reader
        loop.add_reader(self._fd, self._signalled)

    def stop(self) -> None:
        """Stop watching (before the sockets close); nothing more is read."""
        loop, self._loop = self._loop, None
        if self._later is not None:
            self._later.cancel()
            self._later = None
        if loop is not None and not self.waiting:
            self._unwatch(self._fd)
        self.waiting = False

    def drain(self) -> None:
        """Read and apply every batch waiting (hot path: before each routing decision; a
        no-op unless the socket signalled)."""
        if self.waiting:
            self._read(burst=False)

    def _signalled(self) -> None:
        loop = self._loop
        if loop is None:
            return
        self._unwatch(self._fd)  # level-triggered: it would fire until the socket is read
        self.waiting = True
        self._signalled_s = self._wall()
        if self._delay_s > 0:
            self._later = loop.call_later(self._delay_s, self._read_burst)
        else:
            self._read(burst=True)

    def _read_burst(self) -> None:
        self._read(burst=True)

    def _read(self, *, burst: bool) -> None:
        """Read until the socket is empty; with ``burst``, ``RECEIVE_BURST`` batches at most
        before the event loop runs other work (a decision's drain reads them all)."""
        loop = self._loop
        if loop is None:
            return
        if self._later is not None:
            self._later.cancel()
            self._later = None
        self.waiting = False
        receive, on_message = self._sockets.receive_ready, self._on_message
        while True:
            ready = receive()
            for message in ready:
                try:
                    on_message(message, self._signalled_s)
                except Exception:  # a bug: never a reason to stop hearing the peers
                    log.exception("replica sync: a peer's batch was not applied")
                self._signalled_s = None
            if len(ready) < RECEIVE_BURST:  # empty, and the signal is re-armed
                break
            if burst:  # more may wait: read on at the loop's next turn
                self.waiting = True
                self._later = loop.call_soon(self._read_burst)
                return
        loop.add_reader(self._fd, self._signalled)
