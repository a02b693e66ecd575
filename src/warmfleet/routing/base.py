"""The one plugin interface every routing strategy implements.

The same strategy objects run in the live gateway and in the virtual-time simulator. A strategy
is synchronous and pure apart from its own state (its prefix index, its round-robin cursor) and
the seeded ``random.Random`` it was built with. Load (in-flight requests and tokens) is tracked
by the caller and passed in a ``FleetSnapshot``; the strategy never reads a clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from warmfleet.core.types import Decision, FleetSnapshot, InstanceId, RoutingKey


@runtime_checkable
class Strategy(Protocol):
    """Chooses one instance of a variant for one request.

    ``reads_block_hashes``: whether ``choose``/``on_routed`` read ``key.block_hashes``. A
    strategy that does not (load-only ones, ``prefix_hash``) gets keys without them: the
    gateway then skips hashing each prompt's blocks, the largest part of building a key.
    """

    name: str
    reads_block_hashes: bool

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        """Pick an instance among ``fleet.instances`` (never empty). Must not mutate state that
        ``on_routed`` is meant to update, so a caller may discard a decision."""
        ...

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        """The request goes to ``decision.instance_id`` (called before the next ``choose``):
        learn from it (prefix index)."""
        ...

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        """The variant's instance set is now ``instance_ids``: purge state of removed ones."""
        ...


@runtime_checkable
class LearnsFromRouting(Protocol):
    """A strategy whose learnt state (what the engines are predicted to hold) stays true when
    it replaces another of its kind on the same keys: a reload or an admin change of its
    parameters must not make it forget the fleet's caches."""

    def adopt(self, previous: Strategy) -> None:
        """Take over what ``previous``, the strategy this one replaces, learnt (nothing if it
        is of another kind)."""
        ...


@runtime_checkable
class KvEventSink(Protocol):
    """Exact knowledge of engine caches, fed by engine KV events (BlockStored/BlockRemoved).

    Block hashes here are the *router's* chained hashes of the same token blocks; adapters that
    receive engine-native hashes translate them before calling in.
    """

    def on_blocks_stored(self, instance_id: InstanceId, block_hashes: Sequence[int]) -> None: ...

    def on_blocks_removed(self, instance_id: InstanceId, block_hashes: Sequence[int]) -> None: ...

    def on_instance_cleared(self, instance_id: InstanceId) -> None:
        """All of the instance's cache is gone (restart, reset, or an event gap: resync)."""
        ...


def kv_event_sink_of(strategy: object) -> KvEventSink | None:
    """Where engine KV events go for ``strategy``, if it can use exact cache knowledge (its
    ``exact_index``): the live gateway's translator and the simulator's feed alike."""
    sink = getattr(strategy, "exact_index", None)
    return sink if isinstance(sink, KvEventSink) else None


def engine_stats_interval_of(strategy: object) -> float | None:
    """How often ``strategy`` wants the engines' own load figures (``InstanceState``'s
    ``waiting_requests`` and ``kv_usage_frac``) read from their metrics, in seconds; None if it
    never reads them. The live gateway polls the engines at that interval
    (``gateway.engine_stats``) and the simulator samples its engine models at the same one."""
    interval_s = getattr(strategy, "engine_stats_interval_s", None)
    return float(interval_s) if isinstance(interval_s, (int, float)) and interval_s > 0 else None
