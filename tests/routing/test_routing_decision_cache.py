"""The decision path's caches (snapshot columns, incremental ledger loads, bulk LRU touch) must
not change a single decision: each is compared with an uncached evaluation."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.core.types import Decision, FleetSnapshot, InstanceState, RoutingKey
from warmfleet.routing.config import PrefixAffinityConfig
from warmfleet.routing.ledger import WorkLedger
from warmfleet.routing.ring import RendezvousHash
from warmfleet.routing.strategies.prefix_affinity import PrefixAffinityStrategy

BLOCK = 16
IDS = [f"pod-{i}" for i in range(5)]


def _key(blocks: tuple[int, ...], output: int) -> RoutingKey:
    units = len(blocks) * BLOCK + 3
    return RoutingKey(blocks, BLOCK, units, units, blocks[0] if blocks else units, output)


class _Uncached:
    """A ``PrefixAffinityStrategy`` that re-reads every snapshot and recomputes every load at
    every decision (a wrapper, not a subclass: the strategy may be compiled, docs/compiled.md)."""

    def __init__(self, config: PrefixAffinityConfig) -> None:
        self.strategy = PrefixAffinityStrategy(config)
        self.strategy.ledger = WorkLedger(incremental=False)

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        self.strategy._snap = None
        return self.strategy.choose(key, fleet)

    def in_flight_work(self, fleet: FleetSnapshot, requests_only_work: int) -> list[int]:
        self.strategy._snap = None
        return self.strategy.in_flight_work(fleet, requests_only_work)

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        self.strategy.on_routed(key, decision)

    def on_instances_changed(self, instance_ids: list[str]) -> None:
        self.strategy.on_instances_changed(instance_ids)


def _copy(fleet: FleetSnapshot) -> FleetSnapshot:
    """The same values in new objects: nothing can be served from an identity cache."""
    return FleetSnapshot(tuple(replace(i) for i in fleet.instances), fleet.now_s)


# one step: (prefix group or -1 for a fresh chain, blocks to add, output tokens,
#            instance whose oldest request finishes or -1,
#            instance that gets a request the strategy never routed (another replica) or -1,
#            how the next snapshot is built)
_STEP = st.tuples(
    st.integers(-1, 5),
    st.integers(0, 6),
    st.integers(0, 64),
    st.integers(-1, len(IDS) - 1),
    st.integers(-1, len(IDS) - 1),
    st.sampled_from(["same", "retuple", "rebuild", "moved", "recapacity"]),
)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    steps=st.lists(_STEP, min_size=1, max_size=60),
    capacity=st.integers(8, 200),
    count_only=st.booleans(),
)
def test_cached_decisions_equal_uncached_evaluation(
    seed: int,
    steps: list[tuple[int, int, int, int, int, str]],
    capacity: int,
    count_only: bool,
) -> None:
    config = PrefixAffinityConfig(default_capacity_blocks=capacity, epsilon=0.5)
    cached, fresh = PrefixAffinityStrategy(config), _Uncached(config)
    for s in (cached, fresh):
        s.on_instances_changed(IDS)
    rng = random.Random(seed)
    groups = [tuple(rng.getrandbits(64) for _ in range(rng.randrange(1, 30))) for _ in range(6)]
    requests = dict.fromkeys(IDS, 0)
    tokens = dict.fromkeys(IDS, 0)
    live: dict[str, list[int]] = {i: [] for i in IDS}
    caps = dict.fromkeys(IDS, 0)

    def build(keep: tuple[InstanceState, ...] = ()) -> FleetSnapshot:
        """New objects, but those in ``keep`` that still hold the same values (the gateway's
        snapshot: only the instances whose load or capacity moved are new objects)."""
        kept = {s.instance_id: s for s in keep}
        states = []
        for i in IDS:
            load = 0 if count_only else tokens[i]
            state = InstanceState(i, requests[i], load, kv_capacity_blocks=caps[i])
            old = kept.get(i)
            states.append(old if old == state else state)
        return FleetSnapshot(tuple(states))

    fleet = build()
    for group, extra, output, finish, foreign, mode in steps:
        base = groups[group] if group >= 0 else ()
        blocks = base + tuple(rng.getrandbits(64) for _ in range(extra))
        k = _key(blocks, output)
        mine, theirs = cached.choose(k, fleet), fresh.choose(k, _copy(fleet))
        assert mine == theirs
        for s, d in ((cached, mine), (fresh, theirs)):
            s.on_routed(k, d)
        # a decision for the same snapshot again: served from the caches, still identical
        assert cached.choose(k, fleet) == fresh.choose(k, _copy(fleet))
        assert cached.in_flight_work(fleet, 7) == fresh.in_flight_work(_copy(fleet), 7)
        requests[mine.instance_id] += 1
        tokens[mine.instance_id] += k.prompt_tokens + output
        live[mine.instance_id].append(k.prompt_tokens + output)
        if finish >= 0 and live[IDS[finish]]:
            done = live[IDS[finish]].pop(0)
            requests[IDS[finish]] -= 1
            tokens[IDS[finish]] -= done
        if foreign >= 0:
            live[IDS[foreign]].append(rng.randrange(1, 4000))
            requests[IDS[foreign]] += 1
            tokens[IDS[foreign]] += live[IDS[foreign]][-1]
        if mode == "rebuild":
            fleet = build()
        elif mode in ("moved", "recapacity"):
            if mode == "recapacity":
                caps[rng.choice(IDS)] = rng.choice([0, capacity // 2 + 1, capacity * 2])
            fleet = build(fleet.instances)
        elif mode == "retuple":  # a new tuple of the very same objects
            fleet = FleetSnapshot(tuple(fleet.instances), fleet.now_s)


@given(key_hash=st.integers(0, 2**64 - 1), known=st.integers(0, 6))
@settings(max_examples=50, deadline=None)
def test_ring_walk_with_unknown_ids_matches_per_id_weights(key_hash: int, known: int) -> None:
    ring = RendezvousHash(IDS[:known])
    among = [*IDS, "pod-x"]
    expected = sorted(((ring.weight(key_hash, i), i) for i in among), reverse=True)
    assert ring.walk(key_hash, among) == [i for _w, i in expected]
    assert ring.walk(key_hash, IDS[:known]) == [i for _w, i in expected if i in IDS[:known]]
