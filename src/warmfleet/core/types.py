"""Value types that cross layer boundaries: routing keys, fleet snapshots, decisions.

Everything here is immutable and cheap to build on the hot path (slots dataclasses).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

InstanceId = str


class Reason(StrEnum):
    """Why a routing decision picked its instance; becomes a metric label and a header."""

    PREFIX_HIT = "prefix_hit"  # the chosen instance is predicted to hold a prefix of the prompt
    OVERFLOW = "overflow"  # the preferred instance was at its cap; spilled to the next one
    REPLICATE = "replicate"  # a hot prefix was placed on an additional instance
    NO_MATCH = "no_match"  # no instance holds a prefix; placed by hash among least-loaded
    LOAD_BALANCE = "load_balance"  # chosen by load alone (least outstanding, power of two, gate)
    RANDOM = "random"
    ROUND_ROBIN = "round_robin"
    HASH = "hash"  # consistent-hash owner of the prefix (prefix_hash strategy)
    SESSION = "session"  # the instance the request's session was last routed to (prefix_affinity)
    REPLAYED = "replayed"  # simulator only: the instance a captured request went to live
    # flow control (warmfleet.flow): the request waited in the gateway's queue, then ...
    QUEUED = "queued"  # ... went to the strategy's choice once it had room
    SPILL_AFTER_WAIT = "spill_after_wait"  # ... went elsewhere: predicted cheaper than waiting
    # ... or was answered without being served (429/503 + Retry-After)
    SHED = "shed"  # overload: the queue was full (lowest priority first) or a tenant's limit
    DEADLINE = "deadline"  # it could not start before its deadline (or the longest wait)


@dataclass(frozen=True, slots=True)
class RoutingKey:
    """What a router knows about one request's prompt, with no raw text kept.

    ``block_hashes`` are chained block hashes (each block's hash depends on every block before
    it, and on the seed, model, adapter and tenant folded in at the start of the chain).
    ``units`` counts the prompt in the key's unit (tokens, characters or bytes);
    ``block_size`` is how many units make one block (the last block may be partial and is
    not hashed). ``prompt_tokens`` is the best estimate of the prompt's length in engine
    tokens, used for cost models. ``prefix_hash`` hashes the first ``prefix_length`` units
    (AWS-style routing) together with the tenant key. ``chain_seed`` is where the chain starts
    (salt, model, adapter, tenant; ``None`` if unknown): hashes of chains with different starts
    never name the same tokens. ``session`` is the hash of the request's session id (a
    conversation or agent program: ``x-warmfleet-session``, an agent's session header or
    ``prompt_cache_key``), salted with the chain seed; ``None`` without one.
    """

    block_hashes: tuple[int, ...]
    block_size: int
    units: int
    prompt_tokens: int
    prefix_hash: int
    output_tokens_hint: int = 0
    chain_seed: int | None = None
    session: int | None = None


@dataclass(frozen=True, slots=True)
class InstanceState:
    """One instance as the router sees it at decision time."""

    instance_id: InstanceId
    in_flight_requests: int = 0
    in_flight_tokens: int = 0  # prompt+expected output tokens of requests routed and not done
    waiting_requests: int = 0  # engine-reported queue (scraped), may be stale
    kv_usage_frac: float = 0.0  # engine-reported KV cache usage in [0, 1], may be stale
    kv_capacity_blocks: int = 0  # KV capacity in routing-key blocks; 0 = unknown


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """The healthy instances of one variant, in a stable order, at ``now_s``."""

    instances: tuple[InstanceState, ...]
    now_s: float = 0.0

    def ids(self) -> tuple[InstanceId, ...]:
        return tuple(i.instance_id for i in self.instances)


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one routing decision."""

    instance_id: InstanceId
    reason: Reason
    predicted_cached_blocks: int = 0  # blocks the router expects the chosen instance to hold
    best_cached_blocks: int = 0  # the most any instance was predicted to hold (available reuse)
    spilled: bool = False
