"""prefix_affinity as the fleet and the router change: little movement when an instance is
added or removed (prefix_hash too), a removed instance purged and its groups placed again, the
exact index overriding the approximate one, capacity bounding the index, instances the strategy
does not know still routable, the same seed giving the same decisions for every strategy, and a
replacing router keeping what the old one learnt."""

from __future__ import annotations

import random
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st
from routing_support import LoadTracker, affinity, chain, idle, ids, key

from warmfleet.core.types import Decision, FleetSnapshot, InstanceState, Reason, RoutingKey
from warmfleet.routing.base import Strategy
from warmfleet.routing.config import PrefixAffinityConfig, PrefixHashConfig, RoutingConfig
from warmfleet.routing.factory import build_strategy, strategy_config
from warmfleet.routing.movement import moved_fraction
from warmfleet.routing.parse import parse_chat
from warmfleet.routing.router import Router
from warmfleet.routing.strategies.prefix_affinity import PrefixAffinityStrategy
from warmfleet.routing.strategies.prefix_hash import PrefixHashStrategy


def movement_keys(seed: int, count: int = 400) -> list[RoutingKey]:
    rng = random.Random(seed)
    return [key(chain(rng, rng.randrange(1, 12))) for _ in range(count)]


Factory = Callable[[], Strategy]


def _check_movement(factory: Factory, seed: int) -> None:
    # 2,000 keys: the share a new instance wins is binomial (sd 0.0074 around 1/8), so 1.5/8 is
    # 8 sd away (400 keys put it at 3.8 sd: one seed in ~10,000 failed with 76 keys moved)
    keys = movement_keys(seed, 2000)
    seven, eight = ids(7), ids(8)
    assert moved_fraction(factory, keys, seven, eight) <= 1.5 / 8
    assert moved_fraction(factory, keys, eight, seven) <= 1.5 / 8


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_prefix_affinity_movement_on_scale(seed: int) -> None:
    _check_movement(affinity, seed)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_prefix_hash_strategy_movement_on_scale(seed: int) -> None:
    _check_movement(lambda: PrefixHashStrategy(PrefixHashConfig()), seed)


def test_removed_instance_is_purged_and_its_groups_replaced() -> None:
    s = affinity()
    s.on_instances_changed(ids(4))
    rng = random.Random(9)
    docs = [chain(rng, 10) for _ in range(40)]
    placed = {}
    for doc in docs:
        d = s.choose(key(doc), idle(4))
        s.on_routed(key(doc), d)
        placed[doc] = d.instance_id
    gone = "pod-1"
    assert gone in placed.values()
    s.on_instances_changed([i for i in ids(4) if i != gone])
    assert gone not in s.index.instance_ids
    three = FleetSnapshot(tuple(InstanceState(i) for i in ids(4) if i != gone))
    for doc in docs:
        assert gone not in s.match(key(doc))
        d = s.choose(key(doc), three)
        if placed[doc] != gone:
            assert d.instance_id == placed[doc]


def test_exact_index_overrides_approximate_where_known() -> None:
    r = Router(RoutingConfig(strategy=PrefixAffinityConfig()), random.Random(0))
    sink = r.kv_event_sink
    assert sink is not None
    s = r.strategy
    assert isinstance(s, PrefixAffinityStrategy)
    r.on_instances_changed(ids(3))
    doc = chain(random.Random(2), 10)
    s.index.insert("pod-0", doc)
    assert s.match(key(doc)) == {"pod-0": 10}
    sink.on_blocks_stored("pod-1", doc[:6])
    sink.on_instance_cleared("pod-0")  # engine says pod-0 has nothing
    assert s.match(key(doc)) == {"pod-1": 6}
    assert Router(RoutingConfig(), random.Random(0)).kv_event_sink is None


def test_unknown_capacity_uses_default_and_reported_capacity_bounds_the_index() -> None:
    s = affinity(default_capacity_blocks=50)
    fleet = FleetSnapshot((InstanceState("a", kv_capacity_blocks=20), InstanceState("b")))
    s.on_instances_changed(fleet.ids())
    rng = random.Random(4)
    for _ in range(30):
        k = key(chain(rng, 10))
        d = s.choose(k, fleet)
        s.on_routed(k, d)
    assert s.index.occupancy("a") <= 20
    assert s.index.occupancy("b") <= 50
    assert s.index.capacity("a") == 20


def test_instances_unknown_to_the_strategy_are_still_routable() -> None:
    s = affinity()
    d = s.choose(key(chain(random.Random(0), 3)), idle(3))
    assert d.instance_id in ids(3)


def run_trace(name: str, seed: int) -> list[tuple[str, str]]:
    strategy = build_strategy(strategy_config(name), random.Random(seed))
    tracker = LoadTracker(5)
    strategy.on_instances_changed(tracker.ids)
    rng = random.Random(seed)
    docs = [chain(rng, 8) for _ in range(6)]
    out = []
    for _ in range(120):
        d = tracker.route(strategy, key(rng.choice(docs) + chain(rng, 2), output=20))
        out.append((d.instance_id, d.reason.value))
        if rng.random() < 0.6:
            victim = rng.choice(tracker.ids)
            tracker.tokens[victim] = tracker.tokens[victim] // 2
            tracker.requests[victim] = tracker.requests[victim] // 2
    return out


def test_same_seed_same_decisions_for_every_strategy() -> None:
    for name in (
        "random",
        "power_of_two",
        "prefix_affinity",
        "sglang_cache_aware",
        "llmd_approx",
        "prefix_hash",
    ):
        assert run_trace(name, 11) == run_trace(name, 11)
    assert run_trace("random", 11) != run_trace("random", 12)


def test_a_replacing_router_keeps_what_the_old_one_learnt() -> None:
    """A reload or an admin change of prefix_affinity's parameters swaps in a new router; it
    keeps the learnt cache map (same keys), unless the keys are built differently or the
    strategy changes kind."""
    body = {"model": "m", "messages": [{"role": "user", "content": "shared doc " * 400}]}
    fleet = idle(4)
    old = Router(RoutingConfig(strategy=PrefixAffinityConfig()), random.Random(1))
    first_key = old.key(parse_chat(body))
    first = old.choose(first_key, fleet)
    old.on_routed(first_key, first)

    def replaced(config: RoutingConfig) -> Decision:
        new = Router(config, random.Random(2))
        new.adopt(old)
        new.on_instances_changed(fleet.ids())
        return new.choose(new.key(parse_chat(body)), fleet)

    tuned = replaced(RoutingConfig(strategy=PrefixAffinityConfig(load_weight=0.5)))
    assert (tuned.instance_id, tuned.reason) == (first.instance_id, Reason.PREFIX_HIT)
    other_keys = RoutingConfig.model_validate(
        {"strategy": {"type": "prefix_affinity"}, "key": {"block_size": 64}}
    )
    assert replaced(other_keys).reason is Reason.NO_MATCH
    new_kind = Router(RoutingConfig(strategy=PrefixHashConfig()), random.Random(2))
    new_kind.adopt(old)  # nothing to take over: no error either
    back = Router(RoutingConfig(strategy=PrefixAffinityConfig()), random.Random(3))
    back.adopt(new_kind)
    back.on_instances_changed(fleet.ids())
    assert back.choose(back.key(parse_chat(body)), fleet).reason is Reason.NO_MATCH
