"""``ReplicaView``: one gateway replica's routing state for one variant, kept in agreement with
its peers by applying their notes (``routing.replica_notes``), with no leader.

The view owns the replica's strategy and the in-flight requests and tokens per instance that
the replica's ``FleetSnapshot`` carries: its own requests plus those its peers reported. A local
routing and a peer's routing take the same path: the strategy's ``on_routed(key, decision)``
(prefix index, fan-out, prompt ends, ``WorkLedger``) and the in-flight counts up; a completion
counts them down.

Applying notes is idempotent per ``(origin, seq)``: a duplicate is ignored, and memory stays
bounded (``window`` sequence numbers and open requests per origin). Order does not matter for
the counts: a ``FinishedNote`` that arrives before its ``RoutedNote`` is remembered, and the
routed note then teaches the strategy but counts nothing. A peer's note about an instance this
replica does not route to (it left the variant, or this replica has not discovered it yet) is
counted, so its end balances, but not learnt. Counts are sums of open requests, never negative.

An origin gone silent is forgotten (``forget_origin``): its open requests stop counting and are
kept aside as *dormant*. Only ``revive`` (its own batches heard again) brings it back, never a
note of it relayed through a peer's log (a dead replica's old notes are learnt, not counted); a
dormant request counts again when a note of it arrives after the revival (the returning
replica's catch-up answer lists its open requests first), and its end drops it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from warmfleet.core.types import Decision, InstanceId, RoutingKey
from warmfleet.routing.base import Strategy
from warmfleet.routing.replica_notes import (
    FinishedNote,
    RoutedNote,
    SyncNote,
    finished_note,
    routed_note,
)

DEFAULT_WINDOW = 1 << 16  # sequence numbers remembered, and requests kept open, per origin
# Forgotten origins (stopped replicas; each restart is a new origin) whose seen numbers are
# still kept to drop their late duplicates; past this many, the oldest one's state goes whole.
FORGOTTEN_ORIGINS = 64


class SeqWindow:
    """Which sequence numbers of one origin were seen, in bounded memory: every number below
    ``floor``, plus ``above`` (numbers at or past it). When more than ``limit`` are above the
    floor, the floor moves up to the oldest of them: a number more than ``limit`` behind the
    newest ones counts as seen (a note that late is dropped)."""

    __slots__ = ("above", "floor", "limit")

    def __init__(self, limit: int = DEFAULT_WINDOW, floor: int = 1) -> None:
        self.limit = limit
        self.floor = floor
        self.above: set[int] = set()

    def __contains__(self, seq: int) -> bool:
        return seq < self.floor or seq in self.above

    def add(self, seq: int) -> bool:
        """Mark ``seq`` seen; False if it already was."""
        above = self.above
        if seq == self.floor and not above:  # the next number, in order (nearly every note)
            self.floor = seq + 1
            return True
        if seq in self:
            return False
        above.add(seq)
        if len(above) > self.limit:
            self.floor = min(above)
        while self.floor in above:
            above.remove(self.floor)
            self.floor += 1
        return True


class _Origin:
    """What one origin replica reported: routed numbers seen, requests open (seq -> instance,
    tokens; oldest first), ends that came before their routings, and the requests that were
    open when it was forgotten (``dormant``: not counted)."""

    __slots__ = ("dormant", "early", "open", "seen")

    def __init__(self, window: int) -> None:
        self.seen = SeqWindow(window)
        self.open: dict[int, tuple[InstanceId, int]] = {}
        self.early: dict[int, None] = {}
        self.dormant: dict[int, tuple[InstanceId, int]] = {}


class ReplicaView:
    """Replica ``replica_id``'s view of ``variant``: ``strategy`` plus in-flight load.

    ``routed``/``finished`` record the replica's own requests and return the notes to send;
    ``apply`` takes a peer's note. ``in_flight_requests``/``in_flight_tokens`` (per instance,
    absent = 0) are the snapshot fields for the next ``strategy.choose``: read them, do not
    modify them.
    """

    def __init__(
        self, replica_id: str, variant: str, strategy: Strategy, *, window: int = DEFAULT_WINDOW
    ) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self.replica_id = replica_id
        self.variant = variant
        self.strategy = strategy
        self.in_flight_requests: dict[InstanceId, int] = {}
        self.in_flight_tokens: dict[InstanceId, int] = {}
        self._window = window
        self._seq = 0
        self._origins: dict[str, _Origin] = {}
        self._forgotten: OrderedDict[str, None] = OrderedDict()
        self._instances: frozenset[InstanceId] = frozenset()

    # ------------------------------------------------------------------ the replica's own

    def routed(self, key: RoutingKey, decision: Decision) -> RoutedNote:
        """This replica routed ``key`` by ``decision``: learn it, count it, and return the note
        for the peers."""
        self._seq += 1
        note = routed_note(self.replica_id, self.variant, self._seq, key, decision)
        self.strategy.on_routed(key, decision)
        self._open(self._origin(note.origin), note)
        return note

    def finished(self, note: RoutedNote) -> FinishedNote:
        """This replica's request ``note`` ended: count it down, return the note for peers."""
        done = finished_note(note)
        self._apply_finished(done)
        return done

    # ------------------------------------------------------------------ peers

    def apply(self, note: SyncNote) -> bool:
        """A peer's note; False if it changed nothing (a duplicate, another variant's, or this
        replica's own note sent back)."""
        if note.variant != self.variant or note.origin == self.replica_id:
            return False
        if isinstance(note, RoutedNote):
            return self._apply_routed(note)
        return self._apply_finished(note)

    def forget_origin(self, origin: str) -> None:
        """Origin ``origin`` is gone (stopped, or its notes can no longer arrive): its open
        requests stop counting (kept dormant until ``revive``). What the strategy learnt from
        it stays (the engines still hold those prefixes), and so do the numbers seen and the
        ends that came before their routings: a note of it that arrives later is still applied
        once at most, and counts nothing until it is revived. With more than
        ``FORGOTTEN_ORIGINS`` origins forgotten since, its state goes whole (memory stays
        bounded over any number of restarts)."""
        state = self._origins.get(origin)
        if state is None or origin == self.replica_id:
            return
        for instance_id, tokens in state.open.values():
            self._count(instance_id, -1, -tokens)
        self._sleep(state, state.open)
        state.open.clear()  # (early ends stay: a routing of one that comes later counts nothing)
        self._forgotten[origin] = None
        self._forgotten.move_to_end(origin)
        if len(self._forgotten) > FORGOTTEN_ORIGINS:
            oldest, _ = self._forgotten.popitem(last=False)
            del self._origins[oldest]

    def revive(self, origin: str) -> None:
        """Origin ``origin`` is heard again (its own batches: a healed partition): its notes
        count again, and so does each dormant request a note of it then arrives for."""
        self._forgotten.pop(origin, None)

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        """The variant's routable instances are now ``instance_ids``."""
        self._instances = frozenset(instance_ids)
        self.strategy.on_instances_changed(instance_ids)
        for gone in [i for i, n in self.in_flight_requests.items() if n == 0]:
            if gone not in self._instances:
                del self.in_flight_requests[gone], self.in_flight_tokens[gone]

    def open_requests(self) -> Mapping[str, int]:
        """Requests counted in flight, per origin (own included)."""
        return {origin: len(state.open) for origin, state in self._origins.items()}

    # ------------------------------------------------------------------ internals

    def _origin(self, origin: str) -> _Origin:
        state = self._origins.get(origin)
        if state is None:
            state = self._origins[origin] = _Origin(self._window)
        return state

    def _apply_routed(self, note: RoutedNote) -> bool:
        state = self._origin(note.origin)
        seq = note.seq
        if seq < 1 or seq in state.seen:
            if state.dormant and seq in state.dormant and note.origin not in self._forgotten:
                self._reopen(state, seq)  # still open on a replica heard again
                return True
            return False
        if note.instance_id in self._instances:
            self.strategy.on_routed(note.key, note.decision)
        if seq in state.early:  # it already ended: learnt, not counted
            del state.early[seq]
            state.seen.add(seq)
        elif self._forgotten and note.origin in self._forgotten:  # relayed: learnt, dormant
            state.seen.add(seq)
            self._sleep(state, {seq: (note.instance_id, note.tokens)})
        else:
            self._open(state, note)
        return True

    def _sleep(self, state: _Origin, entries: Mapping[int, tuple[InstanceId, int]]) -> None:
        """Keep ``entries`` dormant (not counted); the oldest go past ``window``."""
        dormant = state.dormant
        dormant.update(entries)
        while len(dormant) > self._window:
            del dormant[next(iter(dormant))]

    def _reopen(self, state: _Origin, seq: int) -> None:
        self._add_open(state, seq, state.dormant.pop(seq))

    def _open(self, state: _Origin, note: RoutedNote) -> None:
        state.seen.add(note.seq)
        self._add_open(state, note.seq, (note.instance_id, note.tokens))

    def _add_open(self, state: _Origin, seq: int, entry: tuple[InstanceId, int]) -> None:
        state.open[seq] = entry
        self._count(entry[0], 1, entry[1])
        if len(state.open) > self._window:  # its end was lost: stop counting the oldest
            oldest = next(iter(state.open))
            instance_id, tokens = state.open.pop(oldest)
            self._count(instance_id, -1, -tokens)

    def _apply_finished(self, note: FinishedNote) -> bool:
        state = self._origin(note.origin)
        entry = state.open.pop(note.seq, None)
        if entry is not None:
            self._count(entry[0], -1, -entry[1])
            return True
        if state.dormant and state.dormant.pop(note.seq, None) is not None:
            return False  # it ended while its replica was forgotten: never counted again
        if note.seq < 1 or note.seq in state.seen or note.seq in state.early:
            return False  # already ended (a duplicate), or too old to matter
        state.early[note.seq] = None
        if len(state.early) > self._window:
            del state.early[next(iter(state.early))]
        return True

    def _count(self, instance_id: InstanceId, requests: int, tokens: int) -> None:
        count = self.in_flight_requests.get(instance_id, 0) + requests
        if count == 0 and instance_id not in self._instances:
            self.in_flight_requests.pop(instance_id, None)
            self.in_flight_tokens.pop(instance_id, None)
            return
        self.in_flight_requests[instance_id] = count
        self.in_flight_tokens[instance_id] = self.in_flight_tokens.get(instance_id, 0) + tokens
