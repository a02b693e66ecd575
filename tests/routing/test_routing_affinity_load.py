"""prefix_affinity under load: a hot prefix is replicated in hash order (not spilled at
random), the load bound is never exceeded (hypothesis, also in a closed loop) except by a
conversation's next turn, exact repeats of one prompt spill past it, and the work ledger counts
hits as less work and forgets finished requests."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from routing_support import BLOCK, LoadTracker, affinity, chain, ids, key

from warmfleet.core.types import Decision, FleetSnapshot, InstanceState, Reason, RoutingKey
from warmfleet.routing.strategies.prefix_affinity import PrefixAffinityStrategy


def test_hot_prefix_is_replicated_in_hash_order() -> None:
    s = affinity(epsilon=0.25)
    n = 8
    s.on_instances_changed(ids(n))
    tracker = LoadTracker(n)
    rng = random.Random(5)
    doc = chain(rng, 40)
    # one hot prefix, requests that do not finish: demand grows past one instance's share
    decisions = [tracker.route(s, key(doc + chain(rng, 2), output=50)) for _ in range(40)]
    used = list(dict.fromkeys(d.instance_id for d in decisions))
    reasons = Counter(d.reason for d in decisions)
    assert decisions[0].reason is Reason.NO_MATCH
    assert set(reasons) == {Reason.NO_MATCH, Reason.PREFIX_HIT, Reason.REPLICATE}
    assert reasons[Reason.REPLICATE] == len(used) - 1 >= 2
    # replicas are added in the prefix's hash order, not at random
    walk = s.ring.walk(doc[-1], ids(n))
    assert used[1:] == [i for i in walk if i != used[0]][: len(used) - 1]
    # and every later request of the prefix lands on a holder
    assert all(d.predicted_cached_blocks == 40 for d in decisions if d.reason is Reason.PREFIX_HIT)


def test_hot_prefix_does_not_spill_at_random_under_background_load() -> None:
    s = affinity(epsilon=0.25)
    s.on_instances_changed(ids(8))
    tracker = LoadTracker(8)
    rng = random.Random(5)
    doc = chain(rng, 40)
    hot = []
    for i in range(200):
        if i % 2:
            tracker.route(s, key(chain(rng, 10), output=50))
        else:
            hot.append(tracker.route(s, key(doc + chain(rng, 2), output=50)))
        if i % 3 == 0:  # some work finishes
            for pod in tracker.ids:
                tracker.tokens[pod] = tracker.tokens[pod] * 3 // 4
    assert all(d.reason in {Reason.PREFIX_HIT, Reason.REPLICATE} for d in hot[1:])
    assert sum(1 for d in hot if d.reason is Reason.PREFIX_HIT) > len(hot) / 2


loads_st = st.lists(st.integers(0, 50_000), min_size=2, max_size=12)


@settings(max_examples=80, deadline=None)
@given(
    loads=loads_st,
    seed=st.integers(0, 2**32),
    epsilon=st.sampled_from([0.05, 0.25, 1.0]),
    min_match=st.sampled_from([0.0, 0.5, 0.9]),
    floor=st.sampled_from([0.0, 2.0]),
)
def test_bounded_load_is_never_exceeded(
    loads: list[int], seed: int, epsilon: float, min_match: float, floor: float
) -> None:
    rng = random.Random(seed)
    s = affinity(
        epsilon=epsilon,
        min_match_fraction=min_match,
        load_weight=rng.choice([0.0, 0.02, 1.0]),
        load_floor_requests=floor,
        placement_by=rng.choice(["load", "occupancy"]),
    )
    n = len(loads)
    s.on_instances_changed(ids(n))
    docs = [chain(rng, rng.randrange(1, 30)) for _ in range(4)]
    for _ in range(30):
        s.on_routed(
            key(rng.choice(docs) + chain(rng, 2)), Decision(rng.choice(ids(n)), Reason.RANDOM)
        )
    fleet = FleetSnapshot(
        tuple(InstanceState(i, 1, load) for i, load in zip(ids(n), loads, strict=True))
    )
    for _ in range(10):
        k = key(rng.choice(docs) + chain(rng, rng.randrange(0, 20)), output=rng.randrange(0, 500))
        work_loads, bound, exempt = work_bound(s, k, fleet, epsilon, floor)
        d = s.choose(k, fleet)
        if not (exempt and d.reason is Reason.PREFIX_HIT):
            assert work_loads[ids(n).index(d.instance_id)] <= bound


def work_bound(
    s: PrefixAffinityStrategy, k: RoutingKey, fleet: FleetSnapshot, epsilon: float, floor: float
) -> tuple[list[int], float, bool]:
    """The strategy's in-flight work per instance, the bound on it, and whether the request
    continues a private prefix (a conversation's next turn, which may pass the bound; an exact
    repeat continues nothing).

    floor 0: CHWBL's bound in predicted work; otherwise idle-ish instances are always eligible.
    """
    work = k.prompt_tokens + k.output_tokens_hint
    loads = s.in_flight_work(fleet, work)
    best = max(s.match(k).values(), default=0)
    least = max(0, k.prompt_tokens - best * BLOCK) + k.output_tokens_hint
    bound = max((1 + epsilon) * (sum(loads) + least) / len(loads), floor * work)
    hashes = k.block_hashes
    return loads, bound, 0 < best < len(hashes) and s.is_private(hashes[best - 1])


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    epsilon=st.sampled_from([0.1, 0.25, 1.0]),
    floor=st.sampled_from([0.0, 2.0]),
)
def test_bounded_load_holds_in_a_closed_loop(seed: int, epsilon: float, floor: float) -> None:
    rng = random.Random(seed)
    s = affinity(epsilon=epsilon, load_floor_requests=floor)
    tracker = LoadTracker(6)
    s.on_instances_changed(tracker.ids)
    docs = [chain(rng, 20) for _ in range(3)]
    for _ in range(300):
        k = key(rng.choice(docs) + chain(rng, 3), output=rng.randrange(10, 100))
        loads, bound, exempt = work_bound(s, k, tracker.snapshot(), epsilon, floor)
        assert not exempt
        d = tracker.route(s, k)
        assert loads[tracker.ids.index(d.instance_id)] <= bound
        tracker.sent[d.instance_id].append(k.prompt_tokens + k.output_tokens_hint)
        if rng.random() < 0.5:  # some request finishes (any of the instance's, not the oldest)
            victim = rng.choice([i for i in tracker.ids if tracker.sent[i]])
            tokens = tracker.sent[victim].pop(rng.randrange(len(tracker.sent[victim])))
            tracker.add(victim, -tokens, -1)


def _one_document(
    instances: int, seed: int
) -> tuple[PrefixAffinityStrategy, LoadTracker, random.Random, tuple[int, ...]]:
    """``prefix_affinity`` over ``instances``, its caller's tracker, and a 40-block document."""
    s = affinity()
    tracker = LoadTracker(instances)
    s.on_instances_changed(tracker.ids)
    rng = random.Random(seed)
    return s, tracker, rng, chain(rng, 40)


def test_work_ledger_counts_hits_as_less_work_and_forgets_finished_requests() -> None:
    s, tracker, rng, doc = _one_document(2, 21)
    cold = tracker.route(s, key(doc + chain(rng, 1), output=10))
    hit = tracker.route(s, key(doc + chain(rng, 1), output=10))
    assert hit.reason is Reason.PREFIX_HIT
    assert hit.instance_id == cold.instance_id
    pod = tracker.ids.index(cold.instance_id)
    full = 41 * BLOCK + 5 + 10
    # the cold request adds its whole prompt, the hit only its uncached tail and its output
    assert s.in_flight_work(tracker.snapshot())[pod] == full + (BLOCK + 5 + 10)
    # the caller reports the cold request finished (one request, its tokens): the ledger drops
    # exactly that entry, not the oldest-but-wrong one
    tracker.add(cold.instance_id, -full, -1)
    assert s.in_flight_work(tracker.snapshot())[pod] == BLOCK + 5 + 10
    # tokens the ledger never saw (another gateway replica) count in full
    tracker.add(cold.instance_id, 1000)
    assert s.in_flight_work(tracker.snapshot())[pod] == BLOCK + 5 + 10 + 1000


def test_a_snapshot_without_an_instance_keeps_its_ledger_entries() -> None:
    """A retry's snapshot leaves out the instance that failed: the hits in flight there still
    count as the little work they are when the next snapshot has it again (they were forgotten,
    and its in-flight tokens then counted in full); an instance that leaves the fleet goes."""
    s, tracker, rng, doc = _one_document(3, 23)
    first = tracker.route(s, key(doc + chain(rng, 1), output=10))
    for _ in range(3):
        assert tracker.route(s, key(doc + chain(rng, 1), output=10)).reason is Reason.PREFIX_HIT
    pod = tracker.ids.index(first.instance_id)
    before = s.in_flight_work(tracker.snapshot())[pod]
    assert before < tracker.tokens[first.instance_id]  # hits: less work than their tokens
    others = tuple(st for st in tracker.snapshot().instances if st.instance_id != first.instance_id)
    s.in_flight_work(FleetSnapshot(others))
    assert s.in_flight_work(tracker.snapshot())[pod] == before
    s.on_instances_changed([i for i in tracker.ids if i != first.instance_id])
    s.on_instances_changed(tracker.ids)  # left, and came back with the same requests in flight
    assert s.in_flight_work(tracker.snapshot())[pod] == tracker.tokens[first.instance_id]


def test_conversation_is_followed_past_the_load_bound_but_a_shared_prefix_is_not() -> None:
    s = affinity(epsilon=0.1, load_floor_requests=0.0)
    tracker = LoadTracker(4)
    s.on_instances_changed(tracker.ids)
    rng = random.Random(22)
    turn = key(chain(rng, 30), output=10)
    home = tracker.route(s, turn).instance_id
    doc = chain(rng, 30)
    doc_home = tracker.route(s, key(doc + chain(rng, 1), output=10)).instance_id
    # both homes become busier than the bound allows (work the ledger does not know), though
    # not so busy that waiting there costs more than recomputing the prefix elsewhere
    for pod in {home, doc_home}:
        tracker.add(pod, 10_000)
    # the conversation's next turn continues its own earlier prompt: it stays home
    nxt = key(turn.block_hashes + chain(rng, 3), output=10)
    loads, bound, exempt = work_bound(s, nxt, tracker.snapshot(), 0.1, 0.0)
    assert exempt
    assert loads[tracker.ids.index(home)] > bound
    d = tracker.route(s, nxt)
    assert (d.instance_id, d.reason) == (home, Reason.PREFIX_HIT)
    # a shared document is a hot spot: it is replicated instead
    assert not s.is_private(doc[-1])
    d = tracker.route(s, key(doc + chain(rng, 1), output=10))
    assert d.reason is Reason.REPLICATE
    assert d.instance_id != doc_home


def test_exact_repeats_of_one_prompt_spill_past_the_load_bound() -> None:
    """The same whole prompt sent by many clients at once (a popular query, a retry storm, a
    benchmark replaying its prompts) is a hot spot, not a conversation: the bound applies."""
    s = affinity(epsilon=0.1, load_floor_requests=0.0)
    tracker = LoadTracker(4)
    s.on_instances_changed(tracker.ids)
    rng = random.Random(24)
    prompt = key(chain(rng, 30), output=10)
    home = tracker.route(s, prompt).instance_id
    assert s.is_private(prompt.block_hashes[-1])  # it ended an earlier prompt...
    tracker.add(home, 10_000)  # ...but its home is over the bound
    loads, bound, exempt = work_bound(s, prompt, tracker.snapshot(), 0.1, 0.0)
    assert not exempt
    assert loads[tracker.ids.index(home)] > bound
    d = tracker.route(s, prompt)
    assert d.reason is Reason.REPLICATE
    assert d.instance_id != home
    # once everything in flight has finished, a repeat goes to a holder: it is all cached there
    for pod in tracker.ids:
        tracker.tokens[pod] = tracker.requests[pod] = 0
    again = tracker.route(s, prompt)
    assert again.reason is Reason.PREFIX_HIT
    assert again.instance_id in {home, d.instance_id}
