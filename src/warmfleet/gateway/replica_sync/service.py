"""``ReplicaSync``: one gateway replica's side of replica sync (``spec.replicaSync``), owned by
the ``Gateway``'s lifespan (``open`` at start, ``run`` a task, ``close`` at stop).

Each variant gets a ``routing.replicas.ReplicaView`` (the simulator's replicas' object) over
the variant's router of the moment; the proxy records each routing and end in it and the notes
come here (``send``: when they leave, docs/replicas.md "Batching"); the peers' batches are
read and applied to the view of the note's variant by ``Inbound`` (when: its docstring).

A starting replica subscribes to its peers, hears each one's stream (from then on nothing a
peer sends is lost to it), asks each for its log (its batches sent or learnt from, up to
``log_bytes``, and open requests) and is ready (``caught_up``) once all answered or
``catch_up_timeout_s`` passed. A peer silent for ``peer_timeout_s`` is gone: its open requests
stop counting (``ReplicaView.forget_origin``); heard again, every peer's log is replayed (notes
are idempotent), as when a peer's batch numbers skip (notes lost on a dropped connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable

import zmq
from prometheus_client import CollectorRegistry

from warmfleet.api.replica_sync import BatchEncoder, ReplicaSyncError
from warmfleet.core.errors import ConfigError
from warmfleet.gateway.replica_sync.config import ReplicaSyncConfig, pod_name
from warmfleet.gateway.replica_sync.curve import CurveKey
from warmfleet.gateway.replica_sync.inbound import Inbound
from warmfleet.gateway.replica_sync.metrics import SyncMetrics
from warmfleet.gateway.replica_sync.peers import PeerWatch
from warmfleet.gateway.replica_sync.router import CurrentRouter, Detached, kept
from warmfleet.gateway.replica_sync.transport import (
    AnswerBudget,
    PayloadLog,
    Sockets,
    batch_message,
    decoded_batches,
    log_frames,
    parse_batch,
)
from warmfleet.gateway.world import GatewayState
from warmfleet.routing.replica_notes import RoutedNote, SyncNote
from warmfleet.routing.replicas import ReplicaView

log = logging.getLogger(__name__)
_MAX_OWN_OPEN = 1 << 16
_PRUNE_TIMEOUTS = 100  # a peer silent this many peer timeouts is no longer listed


class ReplicaSync:
    def __init__(
        self,
        config: ReplicaSyncConfig,
        registry: CollectorRegistry,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.replica_id = config.resolved_replica_id()
        # the notes' origin: this run of the replica (a restarted one numbers from 1 again)
        self.origin = f"{self.replica_id}#{os.urandom(4).hex()}"
        self.endpoint = config.listen.endpoint
        self.metrics = SyncMetrics(registry)
        self.views: dict[str, ReplicaView] = {}  # by "endpoint/variant"; kept across reloads
        self.caught_up = False
        self.catch_up_s: float | None = None
        self.peers = PeerWatch(config.peers, self.endpoint, pod_name(), self._set_peers)
        self._clock = clock
        self._wall = wall
        self._sockets: Sockets | None = None
        self._inbound: Inbound | None = None  # set by ``open``
        self._pending: list[SyncNote] = []
        self._oldest_s = 0.0
        self._last_sent_s = -1e18
        self._interval_s = config.batch_interval_ms / 1000.0
        self._loop: asyncio.AbstractEventLoop | None = None  # set by ``run``
        self._flush_scheduled = False
        self._timer: asyncio.TimerHandle | None = None  # the next batch's, while notes wait
        self._batches = 0  # numbered from 1
        self._last_batch: dict[str, int] = {}  # origin -> number of its last batch heard
        self._resync = asyncio.Event()
        self._ready = asyncio.Event()  # the start's catch-up is over (``caught_up``)
        self._log, self._encoder = PayloadLog(config.log_bytes), BatchEncoder()
        self._own_open: dict[tuple[str, int], RoutedNote] = {}
        self._unsent_routed: set[tuple[str, int]] = set()  # routed notes in ``_pending``
        self._heard: dict[str, float] = {}  # origin -> when last heard (clock)
        self._gone: set[str] = set()

    # ------------------------------------------------------------------ lifecycle

    def open(self, curve: CurveKey | None = None) -> None:
        """Bind the sockets (a busy port is a ``ConfigError`` naming the field); ``curve``: the
        fleet's key (``curve_secret.fleet_curve_key``), None: no authentication."""
        try:
            self._sockets = Sockets(self.endpoint, curve=curve, on_refused=self.metrics.refused.inc)
        except zmq.ZMQError as err:
            why = zmq.strerror(err.errno) if err.errno else err
            where = f"cannot bind {self.endpoint} and the next port"
            raise ConfigError(f"spec.replicaSync.listen: {where}: {why}") from err
        delay_s = self.config.apply_delay_ms / 1000
        self._inbound = Inbound(self._sockets, self.receive, delay_s, self._wall)

    def attach(self, state: GatewayState) -> None:
        """Give every variant of ``state`` its view (after each applied config); a removed
        variant's view is ``Detached`` from its router."""
        variants = {f"{v.endpoint}/{v.name}": v for v in state.variants()}
        for key in self.views.keys() - variants.keys():
            self.views[key].strategy = Detached()
            self.views[key].on_instances_changed(())
        for key, variant in variants.items():
            view = self.views.get(key)
            if view is None:
                view = self.views[key] = ReplicaView(self.origin, key, CurrentRouter(variant))
            elif variant.replica is not view:
                view.strategy = CurrentRouter(variant)  # a variant re-created by a reload
            if variant.replica is not view:
                variant.replica = view
                variant.sync_out = self.send
                if self._inbound is not None:  # peers' batches read before each decision
                    variant.sync_in = self._inbound.drain
                view.on_instances_changed([i.instance_id for i in variant.healthy])

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._pending:  # queued before the loop ran: no timer was armed for them
            self._flush_soon()
        if self._inbound is not None:
            self._inbound.start(self._loop)
        try:
            async with asyncio.TaskGroup() as tasks:
                for name, step in (
                    ("peers", self.peers.run),
                    ("answer", self._serve_sockets),
                    ("tick", self._ticker),
                    ("catch-up", self._catch_up_at_start),
                    ("resync", self._resync_on_return),
                ):
                    tasks.create_task(kept(name, step), name=f"warmfleet-sync-{name}")
        finally:
            self._loop = None
            if self._pending:  # (a timer is armed only while notes wait: this cancels it)
                self.flush()  # a graceful stop sends its last ends
            self.close()

    def close(self) -> None:
        """Close the sockets (idempotent): nothing more is sent or received."""
        sockets, self._sockets = self._sockets, None
        if sockets is not None and self._inbound is not None:  # (``open`` sets both)
            self._inbound.stop()  # before the sockets close: nothing more is read
            sockets.close()

    def describe(self) -> dict[str, object]:
        now = self._clock()
        return {
            "replica_id": self.replica_id,
            "origin": self.origin,
            "caught_up": self.caught_up,
            "catch_up_s": self.catch_up_s,
            "curve": self._sockets is not None and self._sockets.curve,  # peers authenticated
            "peers": sorted(self.peers.current or ()),
            "peers_heard": sorted(o for o, t in self._heard.items() if o not in self._gone),
            "peers_gone": sorted(self._gone),
            "open_requests": {k: dict(v.open_requests()) for k, v in self.views.items()},
            "last_heard_s_ago": {o: round(now - t, 3) for o, t in self._heard.items()},
            "last_batch_heard": dict(self._last_batch),  # over the sync socket, not catch-up
            "batches_sent": self._batches,  # heartbeats included: a peer heard all at this number
            "notes_queued": len(self._pending),  # waiting for the next batch
        }

    def send(self, note: SyncNote) -> None:
        """A note of this replica (hot path), queued. It leaves at the loop's next turn when no
        batch left in the last ``batch_interval_ms``, when it ends the replica's last open
        request, or when it ends a request whose routing is still queued (its client may send
        the next turn to a peer now); else with the next batch (``_flush_due``, or at once at
        ``max_batch_notes``)."""
        own, key = self._own_open, (note.variant, note.seq)
        if isinstance(note, RoutedNote):
            own[key] = note
            if len(own) > _MAX_OWN_OPEN:
                del own[next(iter(own))]
            self._unsent_routed.add(key)
            now = False
        else:
            own.pop(key, None)
            now = not own or key in self._unsent_routed
        pending = self._pending
        pending.append(note)
        if len(pending) == 1:
            self._oldest_s = self._wall()
            now = now or self._clock() - self._last_sent_s >= self._interval_s
            if not now and self._timer is None:
                self._flush_due()  # arms the timer (the interval is not up)
        if now:
            self._flush_soon()
        elif len(pending) >= self.config.max_batch_notes:
            self.flush()

    def _flush_soon(self) -> None:
        """Flush at the loop's next turn: after the callback that queued the note wrote its
        answer (not on the client's critical path), once for every note queued meanwhile."""
        if self._loop is None:
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_scheduled = False
        if self._pending:
            self.flush()

    def flush(self) -> None:
        notes, self._pending = self._pending, []
        self._unsent_routed.clear()
        if self._timer is not None:  # nothing waits for it now (a timer wakes an idle loop)
            self._timer.cancel()
            self._timer = None
        sockets = self._sockets
        if sockets is None:
            return
        payload, bad = self._encoder.encode_valid(notes)
        if bad:  # a bug: never a reason to stop routing, nor to lose the other notes
            log.error("replica sync: %d of a batch's %d notes not encoded", bad, len(notes))
            self.metrics.dropped.labels("encode").inc(bad)
        self._last_sent_s = self._clock()
        self._batches += 1
        if notes:
            self._log.add(payload)
        message = batch_message(self.origin, self._oldest_s, self._batches, payload)
        sockets.send(message)
        self.metrics.batch_sent(len(notes), len(message))

    def _flush_due(self) -> None:
        """A loop timer, no task: queued notes leave ``batch_interval_ms`` after the last batch."""
        self._timer = None
        if not self._pending or self._loop is None:
            return
        wait_s = self._last_sent_s + self._interval_s - self._clock()
        if wait_s > 0:  # a batch left meanwhile: the timer moves on
            self._timer = self._loop.call_later(wait_s, self._flush_due)
        else:
            self.flush()

    def _set_peers(self, endpoints: frozenset[str]) -> None:
        if (sockets := self._sockets) is not None:
            sockets.set_peers(endpoints)
        self.metrics.peers.set(len(endpoints))
        log.info("replica %s: %d sync peers", self.replica_id, len(endpoints))

    def receive(self, message: bytes, arrived_s: float | None = None) -> None:
        """A peer's batch, its delay observed if ``arrived_s`` is known; a bad one is dropped."""
        try:
            batch = parse_batch(message)
        except ReplicaSyncError as err:
            self.metrics.dropped.labels("bad_frame").inc()
            log.debug("replica sync: dropping a message: %s", err)
            return
        if batch.origin == self.origin:
            return
        delay_s = None if arrived_s is None else arrived_s - batch.oldest_queued_s
        self.metrics.batch_received(len(batch.notes), len(message), delay_s)
        self._hear(batch.origin)
        last = self._last_batch.get(batch.origin)
        self._last_batch[batch.origin] = batch.number
        if last is None and batch.number > 1:  # joined after the catch-up: PUB dropped some
            self._resync.set()
        elif last is not None and batch.number > last + 1:  # notes lost (a dropped connection)
            self.metrics.missed.inc(batch.number - last - 1)
            self._resync.set()
        if self.apply(batch.notes):
            self._log.add(batch.payload)

    def apply(self, notes: Iterable[SyncNote]) -> int:
        """Apply peers' notes to the views of their variants; the number that changed one."""
        changed = 0
        heard, now_s = self._heard, self._clock()
        for note in notes:
            if note.origin not in heard and note.origin != self.origin:
                heard[note.origin] = now_s  # known through a peer: forgotten if never heard
            if (view := self.views.get(note.variant)) is None:
                continue
            try:
                changed += view.apply(note)
            except Exception:  # a strategy bug must not stop the replica hearing its peers
                log.exception("replica sync: applying a note of %s failed", note.origin)
        return changed

    def _hear(self, origin: str) -> None:
        """``origin``'s own batches (or catch-up answer) arrived: it is alive."""
        if origin in self._gone or origin not in self._heard:
            for view in self.views.values():  # (a relayed note of it never revives it)
                view.revive(origin)
        if origin in self._gone:
            self._gone.discard(origin)
            self._resync.set()
            log.warning("replica sync: peer %s heard again: replaying the peers' logs", origin)
        self._heard[origin] = self._clock()

    async def _ticker(self) -> None:
        """Heartbeats when idle; peers silent for ``peer_timeout_s`` are forgotten."""
        config = self.config
        while True:
            await asyncio.sleep(config.heartbeat_interval_s / 2)
            now = self._clock()
            if not self._pending and now - self._last_sent_s >= config.heartbeat_interval_s:
                self._oldest_s = self._wall()
                self.flush()  # an empty batch: a heartbeat
            for origin, heard_s in list(self._heard.items()):
                silent_s = now - heard_s
                if origin not in self._gone and silent_s > config.peer_timeout_s:
                    self._forget(origin)
                elif silent_s > _PRUNE_TIMEOUTS * config.peer_timeout_s:  # a past run: drop it
                    del self._heard[origin]
                    self._gone.discard(origin)
                    self._last_batch.pop(origin, None)
            self.metrics.connected.set(len(self._heard) - len(self._gone))

    def _forget(self, origin: str) -> None:
        self._gone.add(origin)
        for view in self.views.values():
            view.forget_origin(origin)
        self.metrics.forgotten.inc()
        log.warning("replica sync: peer %s silent, its open requests forgotten", origin)

    # ------------------------------------------------------------------ catch-up

    async def _serve_sockets(self) -> None:
        """Answer catch-up requests and the CURVE handshakes' ZAP requests."""
        if (sockets := self._sockets) is not None:
            budget, drop = AnswerBudget(self._clock), self.metrics.drop
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(sockets.serve_zap())
                tasks.create_task(sockets.serve_log_requests(self._log_answer, budget, drop))

    def _log_answer(self) -> list[bytes]:
        return log_frames(self.origin, list(self._own_open.values()), self._log)

    async def catch_up(self, endpoints: Iterable[str], timeout_s: float) -> int:
        """Replay the logs of the peers at ``endpoints``; how many answered in time."""
        peers = list(endpoints)
        if not peers or timeout_s <= 0:
            return 0
        results = await asyncio.gather(
            *(self._fetch_one(p, timeout_s) for p in peers), return_exceptions=True
        )
        return sum(1 for r in results if r is True)

    async def _fetch_one(self, endpoint: str, timeout_s: float) -> bool:
        if (sockets := self._sockets) is None:
            return False
        answer = await sockets.fetch_answer(endpoint, timeout_s, self.metrics.drop)
        if answer is None:
            return False
        origin, payloads = answer
        if origin != self.origin:
            self._hear(origin)
            for notes in decoded_batches(payloads, self.metrics.drop):  # requests run between
                self.metrics.catch_up_notes.inc(len(notes))
                self.apply(notes)  # not logged again: a newcomer asks that peer itself
                await asyncio.sleep(0)
        return True

    async def _catch_up_at_start(self) -> None:
        start_s = self._clock()
        deadline_s = start_s + self.config.catch_up_timeout_s
        # First hear each peer over SUB (a PUB drops what it sent before): half the time at most
        heard = self._last_batch
        while (p := self.peers.current) is None or len(heard) < len(p):
            if self._clock() >= (start_s + deadline_s) / 2:
                break
            await asyncio.sleep(0.01)
        self._resync.clear()  # a late join or a gap heard so far: this catch-up covers it
        peers = sorted(self.peers.current or ())
        answered = await self.catch_up(peers, deadline_s - self._clock())
        self.catch_up_s = self._clock() - start_s
        self.metrics.catch_up_s.set(self.catch_up_s)
        if answered < len(peers) or self.peers.current is None or len(heard) < len(peers):
            self.metrics.catch_up_timeouts.inc()
            why = f"{answered} of {len(peers)} peers answered, {len(heard)} heard, in"
            log.warning("replica sync: %s catchUpTimeoutS: ready with a partial view", why)
        self.caught_up = True
        self._ready.set()
        self.metrics.caught_up.set(1)

    async def _resync_on_return(self) -> None:
        await self._ready.wait()  # a gap or late join heard before: the start's catch-up
        while True:
            await self._resync.wait()
            self._resync.clear()
            peers = sorted(self.peers.current or ())
            with contextlib.suppress(Exception):
                await self.catch_up(peers, self.config.catch_up_timeout_s)
