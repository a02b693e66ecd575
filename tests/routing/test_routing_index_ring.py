"""Rendezvous hashing and the prefix indexes."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.routing.base import KvEventSink
from warmfleet.routing.exact_index import ExactPrefixIndex
from warmfleet.routing.index import ApproxPrefixIndex
from warmfleet.routing.ring import RendezvousHash


def ids(n: int) -> list[str]:
    return [f"pod-{i}" for i in range(n)]


def test_walk_is_a_permutation_led_by_the_owner() -> None:
    ring = RendezvousHash(ids(7))
    for key in range(50):
        walk = ring.walk(key)
        assert sorted(walk) == sorted(ids(7))
        assert walk[0] == ring.owner(key)
        assert ring.walk(key, among=walk[2:]) == walk[2:]


def test_owner_is_order_insensitive_and_spreads() -> None:
    a, b = RendezvousHash(ids(8)), RendezvousHash(reversed(ids(8)))
    owners = [a.owner(k) for k in range(4000)]
    assert owners == [b.owner(k) for k in range(4000)]
    counts = [owners.count(i) for i in ids(8)]
    assert max(counts) < 1.2 * 500
    assert min(counts) > 0.8 * 500


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(3, 16))
def test_rendezvous_moves_only_what_it_must(seed: int, n: int) -> None:
    rng = random.Random(seed)
    keys = [rng.getrandbits(64) for _ in range(2000)]
    ring = RendezvousHash(ids(n))
    before = [ring.owner(k) for k in keys]
    ring.add("new-pod")
    after = [ring.owner(k) for k in keys]
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert all(a == "new-pod" for _b, a in moved)
    assert len(moved) / len(keys) <= 1.5 / (n + 1)
    ring.remove("pod-0")
    again = [ring.owner(k) for k in keys]
    changed = [(a, c) for a, c in zip(after, again, strict=True) if a != c]
    assert all(a == "pod-0" for a, _c in changed)


def test_approx_match_longest_prefix_per_instance() -> None:
    index = ApproxPrefixIndex(100)
    index.insert("a", (1, 2, 3, 4))
    index.insert("b", (1, 2, 9))
    index.insert("c", (7, 8))
    assert index.match((1, 2, 3, 4, 5)) == {"a": 4, "b": 2}
    assert index.match((1, 2, 9)) == {"a": 2, "b": 3}
    assert index.match((5, 6)) == {}
    assert index.match(()) == {}
    assert index.holders(1) == 2


def test_approx_lru_evicts_tail_first_and_keeps_chains_whole() -> None:
    index = ApproxPrefixIndex(5)
    index.insert("a", (1, 2, 3))
    index.insert("a", (10, 11, 12))
    assert index.occupancy("a") == 5
    assert index.match((1, 2, 3)) == {"a": 2}  # the tail (3) went first: no hole
    index.insert("a", (1, 2, 3, 4, 5, 6, 7))  # longer than capacity: only the head fits
    assert index.match((1, 2, 3, 4, 5, 6, 7)) == {"a": 5}
    assert index.match((10,)) == {}


def test_capacity_mirrors_instance_and_shrinks() -> None:
    index = ApproxPrefixIndex(10)
    index.set_capacity("a", 4)
    index.insert("a", tuple(range(100, 110)))
    assert index.occupancy("a") == 4
    index.set_capacity("a", 2)
    assert index.occupancy("a") == 2
    index.set_capacity("a", 0)  # unknown: the default
    assert index.capacity("a") == 10


def test_purge_instance_and_reuse_of_bits() -> None:
    index = ApproxPrefixIndex(100)
    index.insert("a", (1, 2))
    index.insert("b", (1, 2))
    index.retain(["b"])
    assert index.match((1, 2)) == {"b": 2}
    assert index.instance_ids == ("b",)
    index.insert("c", (1,))
    assert index.match((1, 2)) == {"b": 2, "c": 1}
    index.remove_instance("b")
    index.remove_instance("c")
    assert index.distinct_blocks == 0
    assert index.total_blocks == 0


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c", "d"]),
            st.lists(st.integers(0, 40), min_size=0, max_size=30),
            st.integers(1, 12),
            st.booleans(),
        ),
        max_size=40,
    )
)
def test_index_never_exceeds_capacity(ops: list[tuple[str, list[int], int, bool]]) -> None:
    index = ApproxPrefixIndex(8)
    for iid, chain, cap, purge in ops:
        index.set_capacity(iid, cap)
        index.insert(iid, tuple(chain))
        if purge and iid == "d":
            index.remove_instance(iid)
        for other in index.instance_ids:
            assert index.occupancy(other) <= index.capacity(other)
        # the reverse map agrees with the per-instance LRUs
        held = {h for o in index.instance_ids for h in index.entries(o)}
        assert index.distinct_blocks == len(held)


def test_exact_index_follows_kv_events() -> None:
    exact = ExactPrefixIndex()
    assert isinstance(exact, KvEventSink)
    assert not exact.knows("a")
    exact.on_blocks_stored("a", [1, 2, 3])
    exact.on_blocks_stored("b", [1])
    assert exact.match((1, 2, 3, 4)) == {"a": 3, "b": 1}
    exact.on_blocks_removed("a", [2, 99])
    assert exact.match((1, 2, 3)) == {"a": 1, "b": 1}
    exact.on_instance_cleared("a")
    assert exact.match((1, 2, 3)) == {"b": 1}
    assert exact.knows("a")
    assert exact.occupancy("a") == 0
    exact.on_instance_cleared("z")
    assert exact.knows("z")
    exact.retain(["a"])
    assert exact.known_instances == ("a",)
    assert exact.match((1,)) == {}
