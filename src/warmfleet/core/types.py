"""Value types that cross layer boundaries: routing keys, fleet snapshots, decisions.

Everything here is immutable and cheap to build on the hot path (slots dataclasses). The
types built for every request write their own ``__init__`` (``init=False``): compiled, it
builds the object in ~20 ns, where the one ``dataclasses`` generates for a frozen class stays
interpreted and costs ~350 ns (docs/compiled.md).
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


@dataclass(frozen=True, slots=True, init=False)
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
    output_tokens_hint: int
    chain_seed: int | None
    session: int | None

    def __init__(  # noqa: PLR0917 (the fields in order, as a dataclass takes them)
        self,
        block_hashes: tuple[int, ...],
        block_size: int,
        units: int,
        prompt_tokens: int,
        prefix_hash: int,
        output_tokens_hint: int = 0,
        chain_seed: int | None = None,
        session: int | None = None,
    ) -> None:
        object.__setattr__(self, "block_hashes", block_hashes)
        object.__setattr__(self, "block_size", block_size)
        object.__setattr__(self, "units", units)
        object.__setattr__(self, "prompt_tokens", prompt_tokens)
        object.__setattr__(self, "prefix_hash", prefix_hash)
        object.__setattr__(self, "output_tokens_hint", output_tokens_hint)
        object.__setattr__(self, "chain_seed", chain_seed)
        object.__setattr__(self, "session", session)


@dataclass(frozen=True, slots=True, init=False)
class InstanceState:
    """One instance as the router sees it at decision time."""

    instance_id: InstanceId
    in_flight_requests: int
    in_flight_tokens: int  # prompt+expected output tokens of requests routed and not done
    waiting_requests: int  # engine-reported queue (scraped), may be stale
    kv_usage_frac: float  # engine-reported KV cache usage in [0, 1], may be stale
    kv_capacity_blocks: int  # KV capacity in routing-key blocks; 0 = unknown

    def __init__(  # noqa: PLR0917 (the fields in order, as a dataclass takes them)
        self,
        instance_id: InstanceId,
        in_flight_requests: int = 0,
        in_flight_tokens: int = 0,
        waiting_requests: int = 0,
        kv_usage_frac: float = 0.0,
        kv_capacity_blocks: int = 0,
    ) -> None:
        object.__setattr__(self, "instance_id", instance_id)
        object.__setattr__(self, "in_flight_requests", in_flight_requests)
        object.__setattr__(self, "in_flight_tokens", in_flight_tokens)
        object.__setattr__(self, "waiting_requests", waiting_requests)
        object.__setattr__(self, "kv_usage_frac", kv_usage_frac)
        object.__setattr__(self, "kv_capacity_blocks", kv_capacity_blocks)


@dataclass(frozen=True, slots=True, init=False)
class FleetSnapshot:
    """The healthy instances of one variant, in a stable order, at ``now_s``."""

    instances: tuple[InstanceState, ...]
    now_s: float

    def __init__(self, instances: tuple[InstanceState, ...], now_s: float = 0.0) -> None:
        object.__setattr__(self, "instances", instances)
        object.__setattr__(self, "now_s", now_s)

    def ids(self) -> tuple[InstanceId, ...]:
        return tuple(i.instance_id for i in self.instances)


@dataclass(frozen=True, slots=True, init=False)
class Decision:
    """The outcome of one routing decision."""

    instance_id: InstanceId
    reason: Reason
    predicted_cached_blocks: int  # blocks the router expects the chosen instance to hold
    best_cached_blocks: int  # the most any instance was predicted to hold (available reuse)
    spilled: bool

    def __init__(
        self,
        instance_id: InstanceId,
        reason: Reason,
        predicted_cached_blocks: int = 0,
        best_cached_blocks: int = 0,
        spilled: bool = False,
    ) -> None:
        object.__setattr__(self, "instance_id", instance_id)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "predicted_cached_blocks", predicted_cached_blocks)
        object.__setattr__(self, "best_cached_blocks", best_cached_blocks)
        object.__setattr__(self, "spilled", spilled)
