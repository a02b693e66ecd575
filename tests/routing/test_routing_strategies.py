"""Load-only strategies, prefix_hash (AWS parity), the peer reproductions, config and factory."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.core.config import parse_document
from warmfleet.core.errors import ConfigError
from warmfleet.core.types import FleetSnapshot, InstanceState, Reason, RoutingKey
from warmfleet.routing.base import Strategy
from warmfleet.routing.config import (
    STRATEGY_NAMES,
    LlmdApproxConfig,
    PrefixHashConfig,
    RoutingConfig,
    SglangCacheAwareConfig,
)
from warmfleet.routing.factory import build_strategy, strategy_config
from warmfleet.routing.movement import moved_fraction
from warmfleet.routing.parse import parse_chat
from warmfleet.routing.router import Router
from warmfleet.routing.strategies.peers import LlmdApproxStrategy, SglangCacheAwareStrategy
from warmfleet.routing.strategies.prefix_hash import PrefixHashStrategy


def fleet(*loads: int, **kw: list[float]) -> FleetSnapshot:
    waiting = kw.get("waiting", [0] * len(loads))
    kv = kw.get("kv", [0.0] * len(loads))
    return FleetSnapshot(
        tuple(
            InstanceState(
                f"i{n}",
                in_flight_requests=load,
                waiting_requests=int(waiting[n]),
                kv_usage_frac=kv[n],
            )
            for n, load in enumerate(loads)
        )
    )


def key(*blocks: int, prefix: int | None = None) -> RoutingKey:
    return RoutingKey(
        tuple(blocks), 16, 16 * len(blocks) + 3, 16 * len(blocks) + 3, prefix or hash(blocks)
    )


def test_every_strategy_builds_and_implements_the_protocol() -> None:
    for name in STRATEGY_NAMES:
        strategy = build_strategy(strategy_config(name), random.Random(0))
        assert isinstance(strategy, Strategy)
        assert strategy.name == name
        f = fleet(0, 1, 2)
        strategy.on_instances_changed(f.ids())
        decision = strategy.choose(key(1, 2), f)
        assert decision.instance_id in f.ids()
        assert isinstance(decision.reason, Reason)
        strategy.on_routed(key(1, 2), decision)


def test_strategy_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match="unknown strategy"):
        strategy_config("nope")
    with pytest.raises(ConfigError, match="concurrencyThreshold"):
        strategy_config("prefix_hash", concurrency_threshold=0)
    with pytest.raises(ConfigError, match="prefixLength"):
        parse_document(RoutingConfig, {"strategy": {"type": "prefix_hash", "prefix_length": 1023}})
    with pytest.raises(ConfigError, match="prefixLength"):
        parse_document(RoutingConfig, {"strategy": {"type": "prefix_hash", "prefix_length": 65537}})
    with pytest.raises(ConfigError, match="concurrencyThreshold"):
        parse_document(
            RoutingConfig, {"strategy": {"type": "prefix_hash", "concurrency_threshold": 1025}}
        )
    with pytest.raises(ConfigError, match="epsilon"):
        parse_document(RoutingConfig, {"strategy": {"type": "prefix_affinity", "epsilon": 0}})
    with pytest.raises(ConfigError, match="must be unset or equal"):
        parse_document(
            RoutingConfig,
            {
                "strategy": {"type": "prefix_hash", "prefix_length": 2048},
                "key": {"prefix_length": 4096},
            },
        )
    config = parse_document(
        RoutingConfig, {"strategy": {"type": "prefix_hash", "prefix_length": 2048}}
    )
    assert config.prefix_length == 2048
    assert RoutingConfig().strategy.type == "random"
    assert RoutingConfig().prefix_length == 4096


def test_random_is_seeded() -> None:
    f = fleet(0, 0, 0, 0)
    runs = []
    for _ in range(2):
        s = build_strategy(strategy_config("random"), random.Random(42))
        runs.append([s.choose(key(1), f).instance_id for _ in range(50)])
    assert runs[0] == runs[1]
    assert len(set(runs[0])) == 4


def test_round_robin_cycles_on_routed() -> None:
    s = build_strategy(strategy_config("round_robin"), random.Random(0))
    f = fleet(0, 0, 0)
    seen = []
    for _ in range(6):
        d = s.choose(key(1), f)
        s.on_routed(key(1), d)
        seen.append(d.instance_id)
    assert seen == ["i0", "i1", "i2"] * 2


def test_least_outstanding_and_power_of_two() -> None:
    lor = build_strategy(strategy_config("least_outstanding_requests"), random.Random(0))
    assert {lor.choose(key(1), fleet(3, 1, 1, 2)).instance_id for _ in range(30)} == {"i1", "i2"}
    p2c = build_strategy(strategy_config("power_of_two"), random.Random(0))
    picks = Counter(p2c.choose(key(1), fleet(9, 0, 9, 9)).instance_id for _ in range(400))
    assert picks["i1"] > 150  # wins every sample that includes it
    assert p2c.choose(key(1), fleet(5)).instance_id == "i0"


def test_prefix_hash_sticks_and_spills_in_hash_order() -> None:
    s = PrefixHashStrategy(PrefixHashConfig(concurrency_threshold=2))
    ids = [f"i{n}" for n in range(5)]
    s.on_instances_changed(ids)
    k = key(1, prefix=12345)
    owner = s.choose(k, fleet(0, 0, 0, 0, 0))
    assert owner.reason is Reason.HASH
    loads = [0] * 5
    loads[ids.index(owner.instance_id)] = 2
    spill = s.choose(k, fleet(*loads))
    assert spill.reason is Reason.OVERFLOW
    assert spill.spilled
    assert spill.instance_id == s._ring.walk(12345, ids)[1]
    # the spill target stays the same while the owner is full (it warms up too)
    assert s.choose(k, fleet(*loads)).instance_id == spill.instance_id
    full = s.choose(k, fleet(2, 3, 2, 4, 2))
    assert full.reason is Reason.LOAD_BALANCE
    walk = [i for i in s._ring.walk(12345, ids) if i in {"i0", "i2", "i4"}]
    assert full.instance_id == walk[0]  # the tie goes to the first in the key's hash order


def test_prefix_hash_ties_at_the_threshold_spread_over_prefixes() -> None:
    """Every instance at the threshold with equal counts: each prefix takes the first instance
    in its own hash order, so the ties spread instead of all going to the snapshot's first."""
    s = PrefixHashStrategy(PrefixHashConfig(concurrency_threshold=1))
    s.on_instances_changed([f"i{n}" for n in range(4)])
    picks = Counter(s.choose(key(1, prefix=p), fleet(1, 1, 1, 1)).instance_id for p in range(200))
    assert set(picks) == {"i0", "i1", "i2", "i3"}
    assert max(picks.values()) < 80


def test_prefix_hash_same_prefix_same_instance_different_tenant_spreads() -> None:
    config = RoutingConfig(strategy=PrefixHashConfig(prefix_length=1024))
    r = Router(config, random.Random(0))
    f = FleetSnapshot(tuple(InstanceState(f"i{n}") for n in range(8)))
    r.on_instances_changed(f.ids())
    doc = "d" * 2000
    same = {
        r.choose(
            r.key(parse_chat({"model": "m", "messages": [{"role": "user", "content": doc + q}]})),
            f,
        ).instance_id
        for q in ("a", "b", "c")
    }
    assert len(same) == 1
    tenants = {
        r.choose(
            r.key(
                parse_chat({"model": "m", "messages": [{"role": "user", "content": doc}]}, f"t{t}")
            ),
            f,
        ).instance_id
        for t in range(40)
    }
    assert len(tenants) >= 6


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_prefix_hash_movement_on_scale(seed: int) -> None:
    rng = random.Random(seed)
    keys = [key(rng.getrandbits(64), prefix=rng.getrandbits(64)) for _ in range(800)]
    seven = [f"pod-{i}" for i in range(7)]
    eight = [*seven, "pod-7"]
    config = PrefixHashConfig()
    assert moved_fraction(lambda: PrefixHashStrategy(config), keys, seven, eight) <= 1.5 / 8
    assert moved_fraction(lambda: PrefixHashStrategy(config), keys, eight, seven) <= 1.5 / 8


def test_sglang_reproduction_branches() -> None:
    s = SglangCacheAwareStrategy(SglangCacheAwareConfig())
    s.on_instances_changed(["i0", "i1", "i2"])
    s.on_routed(key(1, 2, 3, 4), s.choose(key(1, 2, 3, 4), fleet(0, 0, 0)))
    first = s.index.match((1, 2, 3, 4))
    holder = next(iter(first))
    # match rate 4/5 > 0.3: cache hit, even if the holder is busier (below the gate)
    loads = [5, 5, 5]
    loads[int(holder[1])] = 30
    hit = s.choose(key(1, 2, 3, 4, 5), fleet(*loads))
    assert (hit.instance_id, hit.reason) == (holder, Reason.PREFIX_HIT)
    # miss: the smallest tree (an instance with no entries)
    miss = s.choose(key(9, 8, 7), fleet(0, 0, 0))
    assert miss.reason is Reason.NO_MATCH
    assert miss.instance_id != holder
    # imbalance gate: max - min > 64 and max > 1.5 * min -> least loaded, for everybody
    loads = [100, 100, 100]
    loads[int(holder[1])] = 10
    other = (int(holder[1]) + 1) % 3
    loads[other] = 1
    gate = s.choose(key(1, 2, 3, 4, 5), fleet(*loads))
    assert (gate.instance_id, gate.reason) == (f"i{other}", Reason.LOAD_BALANCE)


def test_llmd_reproduction_scores() -> None:
    s = LlmdApproxStrategy(LlmdApproxConfig(), random.Random(0))
    s.on_routed(key(1, 2, 3, 4), type(s.choose(key(1), fleet(0, 0)))("i0", Reason.RANDOM))
    # prefix 3 * 1.0 beats queue 2 * 1.0 difference
    d = s.choose(key(1, 2, 3, 4), fleet(0, 0, waiting=[5, 0]))
    assert (d.instance_id, d.reason) == ("i0", Reason.PREFIX_HIT)
    # half match (1.5) loses to queue (2) + kv (2 * 0.5)
    d = s.choose(key(1, 2, 8, 9), fleet(0, 0, waiting=[5, 0], kv=[0.5, 0.0]))
    assert (d.instance_id, d.reason) == ("i1", Reason.LOAD_BALANCE)
    assert len(s.index.match(tuple(range(1000)))) == 0


key_st = st.builds(
    RoutingKey,
    block_hashes=st.lists(st.integers(0, 2**64 - 1), max_size=12).map(tuple),
    block_size=st.integers(1, 64),
    units=st.integers(0, 2000),
    prompt_tokens=st.integers(0, 2000),
    prefix_hash=st.integers(0, 2**64 - 1),
    output_tokens_hint=st.integers(0, 500),
)
state_st = st.builds(
    InstanceState,
    instance_id=st.sampled_from([f"i{n}" for n in range(6)]),
    in_flight_requests=st.integers(0, 2000),
    in_flight_tokens=st.integers(0, 10**6),
    waiting_requests=st.integers(0, 50),
    kv_usage_frac=st.floats(0.0, 1.0),
    kv_capacity_blocks=st.integers(0, 50),
)


keys_fleet_and_strategy = given(
    keys=st.lists(key_st, min_size=1, max_size=8),
    states=st.lists(state_st, min_size=1, max_size=6, unique_by=lambda s: s.instance_id),
    name=st.sampled_from(STRATEGY_NAMES),
)


@settings(max_examples=40, deadline=None)
@keys_fleet_and_strategy
def test_any_key_and_fleet_gives_a_member_of_the_fleet(
    keys: list[RoutingKey], states: list[InstanceState], name: str
) -> None:
    strategy = build_strategy(strategy_config(name), random.Random(0))
    snapshot = FleetSnapshot(tuple(states))
    for k in keys:
        d = strategy.choose(k, snapshot)
        assert d.instance_id in snapshot.ids()
        strategy.on_routed(k, d)
    strategy.on_instances_changed(snapshot.ids()[:1])


@settings(max_examples=40, deadline=None)
@keys_fleet_and_strategy
def test_strategies_that_do_not_read_block_hashes_decide_the_same_without_them(
    keys: list[RoutingKey], states: list[InstanceState], name: str
) -> None:
    """The gateway skips hashing blocks for these strategies (``reads_block_hashes``): their
    decisions must not change when the hashes are gone."""
    with_hashes = build_strategy(strategy_config(name), random.Random(3))
    if with_hashes.reads_block_hashes:
        return
    without = build_strategy(strategy_config(name), random.Random(3))
    snapshot = FleetSnapshot(tuple(states))
    for k in keys:
        bare = replace(k, block_hashes=())
        a, b = with_hashes.choose(k, snapshot), without.choose(bare, snapshot)
        assert a == b
        with_hashes.on_routed(k, a)
        without.on_routed(bare, b)


def test_block_hash_readers_are_the_prefix_index_strategies() -> None:
    readers = {
        name
        for name in STRATEGY_NAMES
        if build_strategy(strategy_config(name), random.Random(0)).reads_block_hashes
    }
    assert readers == {"prefix_affinity", "sglang_cache_aware", "llmd_approx"}
