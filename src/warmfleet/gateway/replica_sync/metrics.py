"""Replica-sync metrics, on the gateway's registry (all ``warmfleet_gateway_replica_sync_``):

- ``notes_sent_total``, ``notes_received_total`` (applied or not), ``notes_dropped_total{reason}``
  (``bad_frame``: a message that is not a batch, counted once; ``catch_up_bad_frame``: a
  catch-up answer or a batch in it that is not one; ``encode``: a batch this replica could not
  encode. A batch the PUB socket drops at a slow peer's high-water mark is not seen here:
  ZeroMQ drops it silently, and that peer counts the gap in ``batches_missed_total``);
- ``batches_sent_total``, ``batches_missed_total`` (a peer's batch numbers skipped: its logs
  are replayed), ``peers`` (endpoints subscribed to), ``peers_connected`` (origins heard
  within ``peer_timeout_s``), ``origins_forgotten_total`` (peers gone silent: their open requests
  forgotten);
- ``propagation_delay_seconds`` (histogram: a note queued on its replica to arrived here,
  batching included; the oldest note of the first batch read after each signal of the socket,
  which arrived with the signal: so the staleness bound ``D`` observed, without the wait of
  an idle replica's deferred read, docs/replicas.md "Applying");
- ``caught_up`` (1 once this replica caught up or gave up waiting), ``catch_up_seconds`` (the
  last catch-up's duration), ``catch_up_timeouts_total``, ``catch_up_notes_total``.
"""

from __future__ import annotations

from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge

from warmfleet.gateway.metrics import FastCounter, FastHistogram, FastValue

_P = "warmfleet_gateway_replica_sync"
_DELAY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0, 5.0)


def _fast_counter(name: str, documentation: str, registry: CollectorRegistry) -> FastValue:
    """An unlabelled counter updated on every batch: the gateway's lock-free kind (a
    ``prometheus_client`` counter's ``inc`` is a lock and three interpreted calls)."""
    return FastCounter(f"{_P}_{name}", documentation, (), registry).labels()


class SyncMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._traffic(registry)
        self._peers(registry)
        self._catch_up(registry)

    def _traffic(self, registry: CollectorRegistry) -> None:
        """Notes, batches and bytes both ways, and how late they arrive."""
        self.sent = _fast_counter("notes_sent", "Notes sent to the peers", registry)
        self.batches = _fast_counter("batches_sent", "Batches sent", registry)
        self.bytes_sent = _fast_counter(
            "bytes_sent",
            "Bytes of the batches published (each reaches every subscribed peer)",
            registry,
        )
        self.bytes_received = _fast_counter(
            "bytes_received", "Bytes of the peers' batches received", registry
        )
        self.missed = Counter(
            f"{_P}_batches_missed", "Peers' batches never received", registry=registry
        )
        self.received = _fast_counter("notes_received", "Notes received from the peers", registry)
        self.dropped = Counter(
            f"{_P}_notes_dropped", "Messages or batches dropped", ("reason",), registry=registry
        )
        self.delay = FastHistogram(
            f"{_P}_propagation_delay_seconds",
            "A batch's oldest note: queued on its replica to arrived here",
            (),
            buckets=_DELAY_BUCKETS,
            registry=registry,
        ).labels()
        self.recent_delays_s: deque[float] = deque(maxlen=4096)  # the last ones, for reports

    def _peers(self, registry: CollectorRegistry) -> None:
        """The peers subscribed to, heard, forgotten and refused."""
        self.peers = Gauge(f"{_P}_peers", "Peer endpoints subscribed to", registry=registry)
        self.connected = Gauge(
            f"{_P}_peers_connected", "Peers heard within peer_timeout_s", registry=registry
        )
        self.forgotten = Counter(
            f"{_P}_origins_forgotten",
            "Peers gone silent whose open requests were forgotten",
            registry=registry,
        )
        self.refused = Counter(
            f"{_P}_handshakes_refused",
            "Connections to the sync sockets refused: no CURVE key, or not the fleet's",
            registry=registry,
        )

    def _catch_up(self, registry: CollectorRegistry) -> None:
        """A starting or returning replica's catch-up from its peers' logs."""
        self.caught_up = Gauge(
            f"{_P}_caught_up", "1 once caught up (or given up)", registry=registry
        )
        self.catch_up_s = Gauge(
            f"{_P}_catch_up_seconds", "Duration of the last catch-up", registry=registry
        )
        self.catch_up_timeouts = Counter(
            f"{_P}_catch_up_timeouts",
            "Catch-ups that ended at catch_up_timeout_s with peers unanswered",
            registry=registry,
        )
        self.catch_up_notes = Counter(
            f"{_P}_catch_up_notes", "Notes received in catch-up answers", registry=registry
        )

    def drop(self, reason: str) -> None:
        """A message, batch or request dropped for ``reason`` (``notes_dropped_total``)."""
        self.dropped.labels(reason).inc()

    def batch_sent(self, notes: int, size_bytes: int) -> None:
        self.batches.inc()
        self.sent.inc(notes)
        self.bytes_sent.inc(size_bytes)

    def batch_received(self, notes: int, size_bytes: int, delay_s: float | None) -> None:
        """A peer's batch of ``notes`` notes (``delay_s``: since its oldest was queued)."""
        self.bytes_received.inc(size_bytes)
        if notes:
            if delay_s is not None:
                self.observe_delay(delay_s)
            self.received.inc(notes)

    def observe_delay(self, delay_s: float) -> None:
        delay_s = max(0.0, delay_s)  # (wall clocks: another host's may be ahead)
        self.delay.observe(delay_s)
        self.recent_delays_s.append(delay_s)
