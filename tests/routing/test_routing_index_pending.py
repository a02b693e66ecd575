"""``ApproxPrefixIndex`` keeps a chain's new tail pending (one entry, not one per block): it
must answer exactly as one LRU entry per block does, whatever the order of inserts, capacities
and removals (routing/index.py, routing/pending_tails.py)."""

from __future__ import annotations

import random
from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.routing.index import ApproxPrefixIndex

IDS = ("a", "b", "c")


class PerBlockLru:
    """The reference: one LRU entry per block, a chain touched deepest block first."""

    def __init__(self, default_capacity: int) -> None:
        self.default_capacity = default_capacity
        self.lru: dict[str, OrderedDict[int, None]] = {}
        self.cap: dict[str, int] = {}

    def capacity(self, iid: str) -> int:
        return self.cap.get(iid, self.default_capacity)

    def insert(self, iid: str, chain: tuple[int, ...]) -> None:
        lru = self.lru.setdefault(iid, OrderedDict())
        for h in reversed(chain[: self.capacity(iid)]):
            lru[h] = None
            lru.move_to_end(h)
        self._evict(iid)

    def set_capacity(self, iid: str, cap: int) -> None:
        self.cap[iid] = cap
        if iid in self.lru:
            self._evict(iid)

    def _evict(self, iid: str) -> None:
        lru = self.lru[iid]
        while len(lru) > self.capacity(iid):
            lru.popitem(last=False)

    def remove(self, iid: str) -> None:
        self.lru.pop(iid, None)
        self.cap.pop(iid, None)

    def match(self, chain: tuple[int, ...]) -> dict[str, int]:
        out: dict[str, int] = {}
        for iid, lru in self.lru.items():
            run = 0
            while run < len(chain) and chain[run] in lru:
                run += 1
            if run:
                out[iid] = run
        return out


def _chains(rng: random.Random, count: int, latest: float = 0.0) -> list[tuple[int, ...]]:
    """Chained hashes: each chain extends a cut of an earlier one (or a root) by fresh blocks,
    so chains share heads, continue each other and branch inside each other's tails.
    ``latest``: how often a chain extends the latest one whole instead (a conversation's next
    turn: its held run then spans many runs of the index, one per earlier turn)."""
    roots = [rng.getrandbits(64) for _ in range(3)]
    chains: list[tuple[int, ...]] = []
    for _ in range(count):
        if chains and rng.random() < latest:
            base = chains[-1]
            cut = len(base)
        else:
            base = rng.choice(chains) if chains and rng.random() < 0.8 else (rng.choice(roots),)
            cut = rng.randrange(1, len(base) + 1)
        fresh = tuple(rng.getrandbits(64) for _ in range(rng.randrange(0, 10)))
        chains.append(base[:cut] + fresh)
    return chains


def _replay(seed: int, default_capacity: int, steps: int, latest: float = 0.0) -> None:
    rng = random.Random(seed)
    index, reference = ApproxPrefixIndex(default_capacity), PerBlockLru(default_capacity)
    chains = _chains(rng, steps, latest)
    for step, chain in enumerate(chains):
        iid = rng.choice(IDS)
        roll = rng.random()
        if roll < 0.05:
            cap = rng.randrange(1, 2 * default_capacity)
            index.set_capacity(iid, cap)
            reference.set_capacity(iid, cap)
        elif roll < 0.07:
            index.remove_instance(iid)
            reference.remove(iid)
        else:
            expected = reference.match(chain).get(iid, 0)
            hint = rng.choice([-1, expected, rng.randrange(0, len(chain) + 1)])
            index.insert(iid, chain, hint)
            reference.insert(iid, chain)
        probe = rng.choice(chains[: step + 1])
        assert index.match(probe) == reference.match(probe), (seed, step)
        for other in IDS:
            assert index.occupancy(other) == len(reference.lru.get(other, ())), (seed, step)
    for chain in chains:
        assert index.match(chain) == reference.match(chain)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), capacity=st.integers(1, 60), steps=st.integers(1, 120))
def test_pending_tails_answer_as_one_entry_per_block(seed: int, capacity: int, steps: int) -> None:
    _replay(seed, capacity, steps)


def test_many_seeded_replays_at_small_capacities() -> None:
    for seed in range(400):
        _replay(seed, 1 + seed % 25, 80)


def test_conversations_whose_held_runs_span_many_runs() -> None:
    """Turns that continue the latest chain whole: a touch walks more than ``MERGE_RUNS`` runs
    and merges them (routing/held_runs.py)."""
    for seed in range(150):
        _replay(seed, 20 + seed % 200, 120, latest=0.75)


def test_a_one_off_tail_is_one_entry_and_a_continuation_takes_it_whole() -> None:
    index = ApproxPrefixIndex(100)
    index.insert("a", (1, 2, 3, 4, 5, 6))  # nothing held: the whole chain pending
    assert index.entries("a") == []
    assert index.occupancy("a") == 6
    assert index.match((1, 2, 3, 4, 5, 6, 7)) == {"a": 6}
    index.insert("a", (1, 2, 3, 9))  # runs into the pending tail for three blocks
    assert index.entries("a") == [3, 2, 1]  # the shared blocks, now held (a run)
    assert index.match((1, 2, 3, 4, 5)) == {"a": 5}  # (4, 5, 6) still pending behind them
    assert index.match((1, 2, 3, 9)) == {"a": 4}
    assert index.occupancy("a") == 7
    assert index.holders(1) == 1


def test_eviction_cuts_a_pending_tail_from_its_deep_end() -> None:
    index = ApproxPrefixIndex(5)
    index.insert("a", (1, 2, 3, 4))
    index.insert("a", (7, 8))  # six blocks: the oldest, 4, goes
    assert index.match((1, 2, 3, 4)) == {"a": 3}
    assert index.occupancy("a") == 5
    index.insert("a", (20, 21, 22))  # three more: 3, 2, then 1 go, in that order
    assert index.match((1, 2, 3)) == {}
    assert index.match((7, 8)) == {"a": 2}


def test_hashes_seen_at_two_places_stay_within_capacity() -> None:
    """Not chains (a hash repeated, tails with common ends): answers may differ from the
    per-block LRU, but the capacity and the reverse map hold."""
    rng = random.Random(5)
    index = ApproxPrefixIndex(6)
    for _ in range(2000):
        iid = rng.choice(IDS)
        index.insert(iid, tuple(rng.randrange(12) for _ in range(rng.randrange(1, 9))))
        for other in index.instance_ids:
            assert index.occupancy(other) <= index.capacity(other)
        held = {h for o in index.instance_ids for h in index.entries(o)}
        assert index.distinct_blocks == len(held)
