"""``warmfleet doctor``'s replica-sync traffic (pure): what the notes of a trace's requests
weigh on the wire, at the trace's own rate, for a fleet of gateway replicas.

Every routed request makes two notes (``routing.replica_notes``): its routing, which carries its
key's block hashes (8 bytes a block), and its end. Each is encoded here as the live gateway
encodes it (``api.replica_sync.BatchEncoder``), with the request's own key (``sim.runner``'s
keys, sessions included when the trace has them; at most ``max_blocks`` hashes, as a live key
carries) and names as long as a Kubernetes deployment's (``NAMES``); batch framing and
TCP/ZeroMQ headers are left out (a few dozen bytes a batch of ~10 notes under load).

The blocks are the trace's: a capture's are the live keys' own, so its figures are the live
ones; a trace hashed in larger blocks (Mooncake's 512 tokens) than the gateway's keys (128
characters, or 16 tokens) understates the routing notes, by 8 bytes for every block more.

With ``N`` replicas each request reaches one of them, whose notes go to the ``N - 1`` others:
a replica receives ``(N - 1) / N`` of the fleet's notes and sends its own ``1 / N`` share to
each of its ``N - 1`` peers. Each replica's catch-up log keeps the fleet's notes (its own and
those that taught it something) up to ``logBytes``: the default ``DEFAULT_LOG_BYTES`` hold the
last ``log_horizon_s`` of this trace's traffic, the routings a restarted replica learns from
a peer before it is ready (docs/replicas.md "Catch-up").

How far back that must reach is the trace's (``hit_reuse``): for each cache hit of the replay,
the time since its prefix was last routed to the instance that served it (the newest note a
replica needs to route that hit as before). The log covers a hit when that gap is within its
horizon; ``log_bytes_for_p99`` is what covers 99 % of the hit tokens at the trace's rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from warmfleet.api.replica_sync import DEFAULT_LOG_BYTES, BatchEncoder
from warmfleet.core.types import Decision, Reason, RoutingKey
from warmfleet.routing.key_spec import DEFAULT_MAX_BLOCKS
from warmfleet.routing.replica_notes import finished_note, routed_note
from warmfleet.sim.workloads.base import WorkloadRequest

# origin (pod name + run), variant (endpoint/variant), instance: names of typical length
NAMES = ("warmfleet-gateway-7d9f8b6c54-x2k4q#1a2b3c4d", "chat/llama-3-1-70b", "vllm-2-6b8f9-zq7wd")


@dataclass(frozen=True, slots=True)
class HitReuse:
    """Each cache hit's reuse gap (seconds since its prefix was last routed to its instance),
    shortest first, with the hit's cached tokens (the weights of the quantiles)."""

    gaps_s: tuple[float, ...]
    tokens: tuple[int, ...]

    def quantile(self, q: float) -> float | None:
        """The gap under which a share ``q`` of the hit tokens falls (None: no hits)."""
        total = sum(self.tokens)
        if not total:
            return None
        running = 0
        for gap_s, tokens in zip(self.gaps_s, self.tokens, strict=True):
            running += tokens
            if running >= q * total:
                return gap_s
        return self.gaps_s[-1]

    def covered(self, horizon_s: float) -> float | None:
        """The share of the hit tokens whose gap is within ``horizon_s``."""
        total = sum(self.tokens)
        if not total:
            return None
        pairs = zip(self.gaps_s, self.tokens, strict=True)
        return sum(tokens for gap_s, tokens in pairs if gap_s <= horizon_s) / total


def hit_reuse(
    arrivals_s: Sequence[float],
    block_hashes: Sequence[Sequence[int]],
    block_tokens: int,
    cached_tokens: Sequence[int],
    instances: Sequence[str],
) -> HitReuse:
    """The reuse gaps of a replay's hits: requests in arrival order, each served by
    ``instances[i]`` ("" = not served) with ``cached_tokens[i]`` from its engine cache. A hit's
    gap runs to the newest earlier request on that instance whose prompt held the deepest
    cached block (or, for blocks only outputs held, the deepest one a prompt did)."""
    if not len(arrivals_s) == len(block_hashes) == len(cached_tokens) == len(instances):
        raise ValueError("hit_reuse: one arrival, chain, cached count and instance a request")
    last: dict[tuple[str, int], float] = {}
    pairs: list[tuple[float, int]] = []
    for i in sorted(range(len(arrivals_s)), key=lambda j: (arrivals_s[j], j)):
        instance, hashes, at_s = instances[i], block_hashes[i], arrivals_s[i]
        if not instance:
            continue
        for depth in range(min(cached_tokens[i] // block_tokens, len(hashes)) - 1, -1, -1):
            seen_s = last.get((instance, hashes[depth]))
            if seen_s is not None:
                pairs.append((at_s - seen_s, cached_tokens[i]))
                break
        for h in hashes:
            last[(instance, h)] = at_s
    pairs.sort()
    return HitReuse(tuple(g for g, _ in pairs), tuple(t for _, t in pairs))


@dataclass(frozen=True, slots=True)
class SyncTraffic:
    """The notes' bytes of one trace's requests, which arrived over ``duration_s``."""

    duration_s: float
    routed_bytes: tuple[int, ...]  # each request's routing note, encoded
    finished_bytes: int  # the end notes', encoded
    replicas: int
    reuse: HitReuse | None = None  # the hits of the run the doctor recommends

    @property
    def requests(self) -> int:
        return len(self.routed_bytes)

    @property
    def total_bytes(self) -> int:
        return sum(self.routed_bytes) + self.finished_bytes

    def _per_s(self, amount: float) -> float | None:
        return amount / self.duration_s if self.duration_s > 0 else None

    def report(self) -> dict[str, object]:
        n = self.replicas
        fleet_bytes_s = self._per_s(self.total_bytes)
        per_request = self.total_bytes / self.requests if self.requests else 0.0
        horizon_s = DEFAULT_LOG_BYTES / fleet_bytes_s if fleet_bytes_s else None
        return {
            "notes_per_request": 2,
            "routed_note_bytes": {
                "mean": sum(self.routed_bytes) / self.requests if self.requests else 0.0,
                "max": max(self.routed_bytes, default=0),
            },
            "finished_note_bytes": self.finished_bytes / self.requests if self.requests else 0.0,
            "fleet_notes_per_s": self._per_s(2 * self.requests),
            "fleet_bytes_per_s": fleet_bytes_s,
            "replica_bytes_per_s": None if fleet_bytes_s is None else fleet_bytes_s * (n - 1) / n,
            "log_bytes": DEFAULT_LOG_BYTES,
            "log_requests": DEFAULT_LOG_BYTES / per_request if per_request else None,
            "log_horizon_s": horizon_s,
            **self._reuse_report(fleet_bytes_s, horizon_s),
        }

    def _reuse_report(
        self, fleet_bytes_s: float | None, horizon_s: float | None
    ) -> dict[str, object]:
        reuse = self.reuse or HitReuse((), ())
        gaps_s = {f"p{q}": reuse.quantile(q / 100) for q in (50, 90, 99)}
        p99_s = gaps_s["p99"]
        return {
            "hit_reuse_gap_s": gaps_s,
            "log_covers_hit_tokens": None if horizon_s is None else reuse.covered(horizon_s),
            "log_bytes_for_p99": (
                None if p99_s is None or fleet_bytes_s is None else round(fleet_bytes_s * p99_s)
            ),
        }


def sync_traffic(
    requests: Sequence[WorkloadRequest],
    keys: Sequence[RoutingKey],
    replicas: int,
    max_blocks: int = DEFAULT_MAX_BLOCKS,
    reuse: HitReuse | None = None,
) -> SyncTraffic:
    """The notes of ``requests`` (routed with ``keys``) behind ``replicas`` gateways
    (``replica_bytes_per_s``: each replica's, in and out alike: it sends its ``1 / N`` share
    to ``N - 1`` peers and receives the other ``(N - 1) / N`` once); ``reuse``: the hits of
    the replay the doctor recommends (``hit_reuse``)."""
    if replicas < 1:
        raise ValueError("replicas must be at least 1")
    origin, variant, instance = NAMES
    encoder = BatchEncoder()
    empty = len(encoder.encode(()))
    routed: list[int] = []
    finished = 0
    for seq, full in enumerate(keys, start=1):
        key = _capped(full, max_blocks)
        blocks = len(key.block_hashes)
        decision = Decision(instance, Reason.PREFIX_HIT, blocks, blocks)
        note = routed_note(origin, variant, seq, key, decision)
        routed.append(len(encoder.encode((note,))) - empty)
        finished += len(encoder.encode((finished_note(note),))) - empty
    arrivals = [r.arrival_s for r in requests]
    duration_s = max(arrivals) - min(arrivals) if arrivals else 0.0
    return SyncTraffic(duration_s, tuple(routed), finished, replicas, reuse)


def _capped(key: RoutingKey, max_blocks: int) -> RoutingKey:
    if len(key.block_hashes) <= max_blocks:
        return key
    return RoutingKey(
        key.block_hashes[:max_blocks], key.block_size, key.units, key.prompt_tokens,
        key.prefix_hash, key.output_tokens_hint, key.chain_seed, key.session,
    )  # fmt: skip
