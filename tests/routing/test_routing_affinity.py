"""prefix_affinity: bounded load, placement, replication, movement, determinism."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.core.types import Decision, FleetSnapshot, InstanceState, Reason, RoutingKey
from warmfleet.routing.base import Strategy
from warmfleet.routing.config import PrefixAffinityConfig, PrefixHashConfig, RoutingConfig
from warmfleet.routing.factory import build_strategy, strategy_config
from warmfleet.routing.movement import moved_fraction
from warmfleet.routing.parse import parse_chat
from warmfleet.routing.router import Router
from warmfleet.routing.strategies.prefix_affinity import PrefixAffinityStrategy, prefill_work
from warmfleet.routing.strategies.prefix_hash import PrefixHashStrategy

BLOCK = 16


def ids(n: int) -> list[str]:
    return [f"pod-{i}" for i in range(n)]


def idle(n: int) -> FleetSnapshot:
    return FleetSnapshot(tuple(InstanceState(i) for i in ids(n)))


def chain(rng: random.Random, n: int, prefix: tuple[int, ...] = ()) -> tuple[int, ...]:
    return prefix + tuple(rng.getrandbits(64) for _ in range(n))


def key(blocks: tuple[int, ...], tail_units: int = 5, output: int = 0) -> RoutingKey:
    units = len(blocks) * BLOCK + tail_units
    prefix = blocks[0] if blocks else units
    return RoutingKey(blocks, BLOCK, units, units, prefix, output)


class LoadTracker:
    """Caller-side in-flight accounting, as the gateway and the simulator keep it."""

    def __init__(self, n: int) -> None:
        self.ids = ids(n)
        self.tokens = dict.fromkeys(self.ids, 0)
        self.requests = dict.fromkeys(self.ids, 0)
        self.sent: dict[str, list[int]] = {i: [] for i in self.ids}

    def snapshot(self) -> FleetSnapshot:
        return FleetSnapshot(
            tuple(InstanceState(i, self.requests[i], self.tokens[i]) for i in self.ids)
        )

    def add(self, pod: str, tokens: int, requests: int = 1) -> None:
        """In-flight work starts (positive) or ends (negative) on ``pod``."""
        self.tokens[pod] += tokens
        self.requests[pod] += requests

    def route(self, strategy: Strategy, k: RoutingKey) -> Decision:
        d = strategy.choose(k, self.snapshot())
        strategy.on_routed(k, d)
        self.add(d.instance_id, k.prompt_tokens + k.output_tokens_hint)
        return d


def affinity(**overrides: object) -> PrefixAffinityStrategy:
    s = build_strategy(strategy_config("prefix_affinity", **overrides), random.Random(0))
    assert isinstance(s, PrefixAffinityStrategy)
    return s


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


def test_work_ledger_counts_hits_as_less_work_and_forgets_finished_requests() -> None:
    s = affinity()
    tracker = LoadTracker(2)
    s.on_instances_changed(tracker.ids)
    rng = random.Random(21)
    doc = chain(rng, 40)
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
