"""prefix_affinity's placement: prefill work grows with context, repeats hit and new groups
are placed by hash (the same on another replica), new groups and distinct suffixes of a shared
system prompt spread, cold starts rotate over the instances, and a short private prefix (a
conversation) is followed while a shared one is not."""

from __future__ import annotations

import random
from collections import Counter

from routing_support import affinity, chain, idle, ids, key

from warmfleet.core.types import Decision, Reason, RoutingKey
from warmfleet.routing.config import PrefixAffinityConfig, RoutingConfig
from warmfleet.routing.parse import parse_chat
from warmfleet.routing.router import Router
from warmfleet.routing.strategies.affinity_view import prefill_work
from warmfleet.routing.strategies.prefix_affinity import COLD_START_DEFICIT, PrefixAffinityStrategy


def test_prefill_work_grows_with_context() -> None:
    assert prefill_work(0, 1000, 1.0, 1e-3) == 0.0
    assert prefill_work(100, 100, 1.0, 0.0) == 100.0
    assert prefill_work(100, 10_000, 1.0, 1e-3) > prefill_work(100, 200, 1.0, 1e-3)


def test_repeat_prefix_hits_and_new_groups_place_by_hash() -> None:
    s = affinity()
    s.on_instances_changed(ids(4))
    rng = random.Random(1)
    doc = chain(rng, 20)
    first = s.choose(key(doc + chain(rng, 1)), idle(4))
    assert first.reason is Reason.NO_MATCH
    s.on_routed(key(doc + chain(rng, 1)), first)
    again = s.choose(key(doc + chain(rng, 1)), idle(4))
    assert (again.instance_id, again.reason) == (first.instance_id, Reason.PREFIX_HIT)
    assert again.predicted_cached_blocks == again.best_cached_blocks == 20
    # another replica with the same config and no shared state places the new group the same way
    twin = affinity()
    twin.on_instances_changed(ids(4))
    assert twin.choose(key(doc + chain(rng, 1)), idle(4)).instance_id == first.instance_id


def test_new_groups_spread_at_concurrency_one() -> None:
    s = affinity()
    s.on_instances_changed(ids(8))
    rng = random.Random(3)
    groups = [chain(rng, 30) for _ in range(64)]
    counts: Counter[str] = Counter()
    order = [g for g in range(64) for _ in range(4)]
    rng.shuffle(order)
    for g in order:  # concurrency 1: every request finishes before the next (idle fleet)
        k = key(groups[g] + chain(rng, 2))
        d = s.choose(k, idle(8))
        s.on_routed(k, d)
        counts[d.instance_id] += 1
    fair = len(order) / 8
    assert len(counts) == 8
    assert max(counts.values()) <= 1.5 * fair


def test_shared_system_prompt_with_distinct_suffixes_spreads() -> None:
    r = Router(RoutingConfig(strategy=PrefixAffinityConfig()), random.Random(0))
    fleet = idle(8)
    r.on_instances_changed(fleet.ids())
    system = {"role": "system", "content": "You are a helpful assistant. " * 40}
    counts: Counter[str] = Counter()
    for user in range(64):
        body = {
            "model": "m",
            "messages": [system, {"role": "user", "content": f"user {user} says " * 150}],
        }
        k = r.key(parse_chat(body))
        d = r.choose(k, fleet)
        r.on_routed(k, d)
        counts[d.instance_id] += 1
    assert len(counts) == 8
    assert max(counts.values()) <= 1.5 * 64 / 8


def test_short_private_prefix_is_followed_but_shared_one_is_not() -> None:
    s = affinity()
    s.on_instances_changed(ids(8))
    rng = random.Random(12)
    system = chain(rng, 8)
    # a conversation: turn 2 repeats turn 1 (8 + 4 blocks) and adds 30 new blocks (28 % match)
    turn1 = key(system + chain(rng, 4))
    first = s.choose(turn1, idle(8))
    s.on_routed(turn1, first)
    turn2 = key(turn1.block_hashes + chain(rng, 30))
    follow = s.choose(turn2, idle(8))
    assert (follow.instance_id, follow.reason) == (first.instance_id, Reason.PREFIX_HIT)
    s.on_routed(turn2, follow)
    # other conversations share only the system prompt: once it has several continuations
    # it is a shared prefix, and new conversations are placed by their own content
    placed: Counter[str] = Counter()
    for _ in range(40):
        k = key(system + chain(rng, 30))
        d = s.choose(k, idle(8))
        s.on_routed(k, d)
        placed[d.instance_id] += 1
    assert s.fanout(system[-1]) >= 2
    assert len(placed) == 8
    assert max(placed.values()) <= 1.5 * 40 / 8 + 1


def test_first_turns_sharing_only_a_system_prompt_are_not_followed() -> None:
    s = affinity(min_match_fraction=0.5)
    s.on_instances_changed(ids(8))
    rng = random.Random(23)
    system = chain(rng, 20)
    first = key(system + chain(rng, 25))
    home = s.choose(first, idle(8))
    s.on_routed(first, home)
    # the system prompt ends inside the earlier prompt: it is not a conversation's history
    assert not s.is_private(system[-1])
    other = s.choose(key(system + chain(rng, 25)), idle(8))
    assert other.reason is Reason.NO_MATCH
    assert other.instance_id != home.instance_id


def test_cold_starts_rotate_over_the_instances() -> None:
    s = affinity()
    s.on_instances_changed(ids(8))
    rng = random.Random(24)
    placed = []
    for _ in range(24):  # equal loads: each instance takes one cold start per round of 8
        k = key(chain(rng, 20))
        d = s.choose(k, idle(8))
        s.on_routed(k, d)
        placed.append(d.instance_id)
    for start in range(0, 24, 8):
        assert sorted(placed[start : start + 8]) == ids(8)


def _place(s: PrefixAffinityStrategy, rng: random.Random, n: int) -> tuple[RoutingKey, Decision]:
    k = key(chain(rng, 20))
    d = s.choose(k, idle(n))
    s.on_routed(k, d)
    return k, d


def test_a_cold_start_placed_on_a_stale_view_is_evened_out() -> None:
    """Two gateway replicas take turns placing ten new conversations on two instances; one
    decision is made before the other replica's previous cold start reached it (its note was
    in flight). The next cold starts even the counts out (5 and 5): with recency alone the
    rotation would carry the extra group to the end (6 and 4), which on the real-vLLM e2e's
    tight KV caches evicted one instance's conversations."""
    replicas = (affinity(), affinity())
    for s in replicas:
        s.on_instances_changed(ids(2))
    rng = random.Random(5)
    counts: Counter[str] = Counter()
    late: tuple[RoutingKey, Decision] | None = None
    for turn in range(10):
        here, there = replicas[turn % 2], replicas[1 - turn % 2]
        k, d = _place(here, rng, 2)
        counts[d.instance_id] += 1
        if late is not None:  # the stale decision is made: the late note arrives now
            here.on_routed(*late)
            late = None
        if turn == 2:
            late = (k, d)  # replica 1 decides turn 3 without it
        else:
            there.on_routed(k, d)
    assert sorted(counts.values()) == [5, 5]


def test_a_joining_instance_takes_a_bounded_run_of_cold_starts() -> None:
    """An instance that joins with no cold starts is preferred until even, but takes at most
    ``COLD_START_DEFICIT`` in a row before the rotation goes on."""
    s = affinity()
    s.on_instances_changed(ids(2))
    rng = random.Random(6)
    for _ in range(40):
        _place(s, rng, 2)
    s.on_instances_changed(ids(3))
    placed = [_place(s, rng, 3)[1].instance_id for _ in range(12)]
    newcomer = ids(3)[2]
    assert placed[:COLD_START_DEFICIT] == [newcomer] * COLD_START_DEFICIT
    assert placed[COLD_START_DEFICIT] != newcomer
    later = Counter(placed[COLD_START_DEFICIT:])  # then a rotation over all three
    assert max(later.values()) - min(later[i] for i in ids(3)) <= 1
