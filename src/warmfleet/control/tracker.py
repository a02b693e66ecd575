"""Peer-distribution tracker: which source each filling node fetches each piece from (pure).

One ``VersionTracker`` per artifact version (cache key). A filling node calls ``plan`` with what
it learnt since its last call (pieces it now holds, piece hashes it computed on origin bytes,
peers that failed it, assignments it gave up) and how many more pieces it can fetch at once; it
gets back that many assignments, each a peer that holds the piece or the origin:

- a piece is fetched from the origin at most ``origin_fetches`` (``k``) times over all nodes,
  in index order, with ``origin_streams`` fetches under way over the fleet: those are handed
  out first (the origin is the scarce link and must never idle while pieces are missing), the
  node's other slots go to peers; further copies come from peers;
- among peers, rarest piece first (fewest holders), each from the holder with the fewest
  uploads under way and below ``max_uploads_per_peer`` (fan-out: a node serves what it has
  as soon as it has it, so the copies spread as a tree, not a star);
- a peer a node reported failed (refused, stalled, served a bad piece) is never offered to that
  node again during the same fill;
- origin last: a piece with no holder the node may use and no fetch of it under way anywhere
  goes to the origin even past ``k`` (counted as a fallback);
- an assignment not reported within ``stall_s`` is released (its node died) and handed out again;
  a node renews the assignments it is still fetching by listing them in each report
  (``fetching``), so a slow fetch of a live node is not handed to a second one;
- a node that has not reported for ``stall_s`` is taken for dead as well, whatever it holds:
  its pieces are not offered until it reports again in the same session. A filling node reports
  at least every ``renew_s`` (well within the bound), and so does a node that serves a version
  after its fill (a report with nothing in it, ``want`` 0). So a node that died, mid-fill or
  after, is a source for at most ``stall_s`` after its last report. A node that leaves reports
  in a new session holding nothing: what it held is forgotten at once.

A peer is offered for a piece only once the piece table has the piece's hash, so every peer
piece is checked before it is written. The table keeps the first hash reported for a piece and
who reported it: a node whose file failed its digests withdraws the hashes it reported for that
file's pieces (``withdrawn``, each with the hash withdrawn: ``withdrawn_hashes``); the tracker
drops an entry only if that node reported it and, the hash given, the entry is that hash (a node
cannot erase another's, nor one it reported in an earlier fill that this fill's bytes did not
match), hands the piece to the origin again and takes the next hash reported for it. Reports
without ``withdrawn``, ``withdrawn_hashes`` or ``fetching`` (older agents) mean what they did: a
piece withdrawn without its hash is matched by the node alone.
Injected clock and seeded random; no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from warmfleet.core.clock import Clock
from warmfleet.core.errors import BadRequestError

ORIGIN = ""  # the source name of the origin in an assignment
MAX_LISTED = 1 << 16  # entries in a report's ``withdrawn``, ``withdrawnHashes`` or ``fetching``
MAX_HASH_CHARS = 128  # a piece hash in ``withdrawnHashes`` (BLAKE3 hex: 64)


def listed_pieces(body: dict[str, Any], name: str) -> tuple[int, ...]:
    """A report's ``withdrawn`` or ``fetching`` (wire form): absent or null is none; otherwise
    a list of at most ``MAX_LISTED`` JSON integers (``VersionTracker.plan`` checks the range).
    For the tracker's HTTP host; BadRequestError names what is wrong."""
    value = body.get(name)
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_LISTED:
        raise BadRequestError(f"{name} must be a list of at most {MAX_LISTED} piece indexes")
    if not all(isinstance(p, int) and not isinstance(p, bool) for p in value):
        raise BadRequestError(f"{name} must hold piece indexes (integers)")
    return tuple(value)


def listed_hashes(body: dict[str, Any], name: str) -> tuple[tuple[int, str], ...]:
    """A report's ``withdrawnHashes`` (wire form): absent or null is none; otherwise an object
    of at most ``MAX_LISTED`` entries, each a piece index (decimal digits) to the hash withdrawn
    (a string of at most ``MAX_HASH_CHARS``). BadRequestError names what is wrong."""
    value = body.get(name)
    if value is None:
        return ()
    if not isinstance(value, dict) or len(value) > MAX_LISTED:
        raise BadRequestError(f"{name} must map at most {MAX_LISTED} piece indexes to hashes")
    out = []
    for piece, digest in value.items():
        if not (piece.isascii() and piece.isdigit() and len(piece) <= 12):
            raise BadRequestError(f"{name} keys must be piece indexes (decimal digits)")
        if not isinstance(digest, str) or not 0 < len(digest) <= MAX_HASH_CHARS:
            raise BadRequestError(f"{name} values must be hashes (strings)")
        out.append((int(piece), digest))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Assignment:
    piece: int
    peer: str = ORIGIN  # node name; ORIGIN for the origin
    url: str = ""  # the peer's base URL

    @property
    def from_origin(self) -> bool:
        return self.peer == ORIGIN


@dataclass(frozen=True, slots=True)
class PlanRequest:
    node: str
    url: str  # where this node serves pieces
    session: str  # one fill; a new session forgets what the node held
    have: tuple[int, ...] = ()  # pieces verified and written since the last call
    hashes: tuple[tuple[int, str], ...] = ()  # BLAKE3 of pieces fetched from the origin
    failed_peers: tuple[str, ...] = ()
    released: tuple[int, ...] = ()  # assignments given up (to be planned again)
    want: int = 0
    # Hashes this node reported and takes back (its file failed the manifest's digests): the
    # pieces, and (newer agents) each with the hash withdrawn, matched against the table's.
    withdrawn: tuple[int, ...] = ()
    withdrawn_hashes: tuple[tuple[int, str], ...] = ()
    fetching: tuple[int, ...] = ()  # assignments still under way here (renewed, not released)


@dataclass(frozen=True, slots=True)
class Plan:
    assignments: tuple[Assignment, ...]
    hashes: dict[int, str]  # the piece table entries of the assigned peer pieces
    complete: bool  # the node holds every piece


@dataclass
class _Node:
    url: str
    session: str
    have: set[int] = field(default_factory=set)
    dropped: set[str] = field(default_factory=set)
    in_flight: dict[int, tuple[str, float]] = field(default_factory=dict)  # piece -> source, t
    seen_s: float = 0.0  # its last report


@dataclass(frozen=True, slots=True)
class TrackerStats:
    origin_assignments: int
    origin_fallbacks: int
    peer_assignments: int
    released: int
    withdrawn: int = 0  # piece table entries withdrawn by their reporter


@dataclass(frozen=True, slots=True)
class TrackerOptions:
    origin_fetches: int = 1  # k: origin copies of each piece
    max_uploads_per_peer: int = 4
    origin_streams: int = 4  # origin fetches under way over the fleet
    # An assignment not reported for this long is handed out again, and the pieces of a node
    # silent this long are no longer offered.
    stall_s: float = 60.0

    def __post_init__(self) -> None:
        if min(self.origin_fetches, self.max_uploads_per_peer, self.origin_streams) < 1:
            raise ValueError("origin_fetches, max_uploads_per_peer, origin_streams must be >= 1")


class VersionTracker:
    def __init__(
        self, pieces: int, clock: Clock, rng: random.Random, options: TrackerOptions
    ) -> None:
        if pieces < 0:
            raise ValueError("pieces must be >= 0")
        self.pieces = pieces
        self._clock = clock
        self._rng = rng
        self._k = options.origin_fetches
        self._max_up = options.max_uploads_per_peer
        self._origin_streams = options.origin_streams
        self._stall_s = options.stall_s
        self.nodes: dict[str, _Node] = {}
        self.table: dict[int, str] = {}  # piece -> BLAKE3, from origin fetches
        self.reporter: dict[int, str] = {}  # piece -> the node that reported its table entry
        self._origin_count = [0] * pieces
        self._stats = {"origin": 0, "fallback": 0, "peer": 0, "released": 0, "withdrawn": 0}

    # ----- queries ---------------------------------------------------------------------
    def stats(self) -> TrackerStats:
        s = self._stats
        return TrackerStats(s["origin"], s["fallback"], s["peer"], s["released"], s["withdrawn"])

    def holders(self, piece: int) -> list[str]:
        """The nodes that may be offered as ``piece``'s source (live ones)."""
        return sorted(n for n, node in self._live().items() if piece in node.have)

    def _live(self) -> dict[str, _Node]:
        """The nodes not taken for dead: heard from within ``stall_s`` (a node that serves a
        version reports at least every ``renew_s``, its fill over or not)."""
        cutoff = self._clock.now_s() - self._stall_s
        return {n: node for n, node in self.nodes.items() if node.seen_s >= cutoff}

    def uploads(self, peer: str) -> int:
        return sum(1 for n in self.nodes.values() for src, _ in n.in_flight.values() if src == peer)

    # ----- the one entry point ------------------------------------------------------------
    def plan(self, req: PlanRequest) -> Plan:
        """BadRequestError (nothing learnt) if ``withdrawn`` or ``fetching`` is too long or
        names a piece out of range."""
        self._check_listed(req)
        node = self._learn(req)
        self._release_stalled()
        slots = max(req.want, 0)
        out: list[Assignment] = []
        if slots:
            out = self._assign(req.node, node, slots)
        now = self._clock.now_s()
        for a in out:
            node.in_flight[a.piece] = (a.peer, now)
        hashes = {a.piece: self.table[a.piece] for a in out if not a.from_origin}
        return Plan(tuple(out), hashes, len(node.have) == self.pieces)

    def _check_listed(self, req: PlanRequest) -> None:
        hashed = tuple(piece for piece, _ in req.withdrawn_hashes)
        for name, listed in (
            ("withdrawn", req.withdrawn),
            ("withdrawnHashes", hashed),
            ("fetching", req.fetching),
        ):
            if len(listed) > MAX_LISTED:
                raise BadRequestError(f"{name} lists more than {MAX_LISTED} pieces")
            if any(not 0 <= p < self.pieces for p in listed):
                raise BadRequestError(f"{name} names a piece out of range (0..{self.pieces - 1})")

    def _learn(self, req: PlanRequest) -> _Node:
        node = self.nodes.get(req.node)
        if node is None or node.session != req.session:  # a new fill: what it held is gone
            if node is not None:
                self._forget_in_flight(node)
            node = self.nodes[req.node] = _Node(req.url, req.session)
        node.url = req.url
        node.seen_s = self._clock.now_s()
        self._withdraw(req, node)  # before its hashes: it may report anew
        for piece, digest in req.hashes:
            if 0 <= piece < self.pieces and piece not in self.table:
                self.table[piece] = digest
                self.reporter[piece] = req.node
        now = self._clock.now_s()
        for piece in req.fetching:
            if piece in node.in_flight:
                node.in_flight[piece] = (node.in_flight[piece][0], now)
        for piece in req.have:
            if 0 <= piece < self.pieces:
                node.have.add(piece)
                node.in_flight.pop(piece, None)
        node.dropped.update(p for p in req.failed_peers if p != req.node)
        for piece in req.released:
            if piece in node.in_flight:
                self._release(node, piece)
        return node

    def _withdraw(self, req: PlanRequest, node: _Node) -> None:
        """``req.node`` takes back the hashes it reported for the pieces withdrawn (its copy
        failed): each entry it reported, and that is the hash given (if one is), leaves the
        table, and the piece may be fetched from the origin again (its holders cannot be
        offered without a hash, and a new origin fetch brings one)."""
        given: dict[int, str | None] = dict.fromkeys(req.withdrawn)
        given.update(req.withdrawn_hashes)
        for piece, digest in given.items():
            node.have.discard(piece)
            if self.reporter.get(piece) != req.node:
                continue  # reported by another node, or not at all: not this node's to take
            if digest is not None and self.table[piece] != digest:
                continue  # an entry it reported earlier, of other bytes: not what failed
            del self.table[piece], self.reporter[piece]
            if self._origin_count[piece] > 0:
                self._origin_count[piece] -= 1
            self._stats["withdrawn"] += 1

    def _release(self, node: _Node, piece: int) -> None:
        source, _ = node.in_flight.pop(piece)
        if source == ORIGIN and self._origin_count[piece] > 0:
            self._origin_count[piece] -= 1
        self._stats["released"] += 1

    def _forget_in_flight(self, node: _Node) -> None:
        for piece in list(node.in_flight):
            self._release(node, piece)

    def _release_stalled(self) -> None:
        cutoff = self._clock.now_s() - self._stall_s
        for node in self.nodes.values():
            for piece, (_, since) in list(node.in_flight.items()):
                if since < cutoff:
                    self._release(node, piece)

    # ----- choosing sources -------------------------------------------------------------
    def _assign(self, name: str, node: _Node, slots: int) -> list[Assignment]:
        missing = [p for p in range(self.pieces) if p not in node.have and p not in node.in_flight]
        load = {n: self.uploads(n) for n in self.nodes}
        live = self._live()  # the nodes that may be offered as sources
        out: list[Assignment] = []
        streams = sum(1 for n in self.nodes.values() for s, _ in n.in_flight.values() if s == "")
        for piece in missing:  # keep the origin busy first: it is the scarce link
            if len(out) >= slots or streams >= self._origin_streams:
                break
            if self._origin_count[piece] < self._k:
                out.append(self._origin(piece, fallback=False))
                streams += 1
        taken = {a.piece for a in out}
        out += self._from_peers(name, node, [p for p in missing if p not in taken], live, load,
                                slots - len(out))  # fmt: skip
        taken = {a.piece for a in out}
        rest = [p for p in missing if p not in taken]
        for piece in rest:
            if len(out) >= slots:
                break
            if (
                piece not in taken
                and self._origin_count[piece] >= self._k
                and self._orphaned(name, node, piece, live)
            ):
                out.append(self._origin(piece, fallback=True))
        return out

    def _usable_holders(
        self, name: str, node: _Node, piece: int, live: dict[str, _Node]
    ) -> list[str]:
        if piece not in self.table:
            return []
        return [
            n
            for n, other in live.items()
            if n != name and piece in other.have and n not in node.dropped
        ]

    def _from_peers(  # noqa: PLR0917
        self,
        name: str,
        node: _Node,
        missing: Iterable[int],
        live: dict[str, _Node],
        load: dict[str, int],
        slots: int,
    ) -> list[Assignment]:
        ranked = []
        for piece in missing:
            holders = self._usable_holders(name, node, piece, live)
            if holders:
                ranked.append((len(holders), self._rng.random(), piece, holders))
        ranked.sort()
        out: list[Assignment] = []
        for _, _, piece, holders in ranked:
            if len(out) >= slots:
                break
            free = [h for h in holders if load[h] < self._max_up]
            if not free:
                continue
            least = min(load[h] for h in free)
            peer = self._rng.choice(sorted(h for h in free if load[h] == least))
            load[peer] += 1
            self._stats["peer"] += 1
            out.append(Assignment(piece, peer, self.nodes[peer].url))
        return out

    def _origin(self, piece: int, *, fallback: bool) -> Assignment:
        self._origin_count[piece] += 1
        self._stats["fallback" if fallback else "origin"] += 1
        return Assignment(piece)

    def _orphaned(self, name: str, node: _Node, piece: int, live: dict[str, _Node]) -> bool:
        """No holder this node may use and no fetch of it under way elsewhere (one that could
        become a holder it may use): only the origin is left."""
        if self._usable_holders(name, node, piece, live):
            return False
        if any(piece in n.have for n in live.values()) and piece not in self.table:
            return False  # its hash is on the way (an origin fetch just reported)
        return not any(
            piece in other.in_flight and n not in node.dropped
            for n, other in self.nodes.items()
            if n != name
        )


class Tracker:
    """The ``VersionTracker`` of every artifact version being distributed."""

    def __init__(self, clock: Clock, rng: random.Random, options: TrackerOptions) -> None:
        self._clock = clock
        self._rng = rng
        self.options = options
        self.versions: dict[str, VersionTracker] = {}

    def plan(self, version: str, pieces: int, req: PlanRequest) -> Plan:
        tracker = self.versions.get(version)
        if tracker is not None and tracker.pieces != pieces:
            raise BadRequestError(
                f"version {version[:16]} has {tracker.pieces} pieces, the request says {pieces}"
            )
        if tracker is None:
            tracker = VersionTracker(pieces, self._clock, self._rng, self.options)
            self.versions[version] = tracker
        return tracker.plan(req)

    def retain(self, versions: Iterable[str]) -> None:
        keep = set(versions)
        for version in [v for v in self.versions if v not in keep]:
            del self.versions[version]
