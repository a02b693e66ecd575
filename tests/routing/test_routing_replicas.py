"""ReplicaView: a replica's strategy and in-flight view, fed by its own routings and its peers'
notes; idempotent, order-tolerant, bounded."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.core.types import (
    Decision,
    FleetSnapshot,
    InstanceId,
    InstanceState,
    Reason,
    RoutingKey,
)
from warmfleet.routing.factory import build_strategy, strategy_config
from warmfleet.routing.keys import key_from_blocks
from warmfleet.routing.replica_notes import FinishedNote, RoutedNote, SyncNote, finished_note
from warmfleet.routing.replicas import FORGOTTEN_ORIGINS, ReplicaView, SeqWindow

IDS = ("a", "b", "c")


class Recorder:
    """Strategy double: records what it learnt."""

    name = "recorder"
    reads_block_hashes = True

    def __init__(self) -> None:
        self.routed: list[tuple[RoutingKey, Decision]] = []
        self.instance_sets: list[tuple[InstanceId, ...]] = []

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        return Decision(fleet.instances[0].instance_id, Reason.LOAD_BALANCE)

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        self.routed.append((key, decision))

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        self.instance_sets.append(tuple(instance_ids))


def _key(n: int, tokens: int = 100, output: int = 10) -> RoutingKey:
    return key_from_blocks(
        tuple(range(1000 * n, 1000 * n + 4)),
        block_size=16,
        units=tokens,
        prompt_tokens=tokens,
        prefix_length=64,
        seed=7,
        output_tokens_hint=output,
    )


def _chain(blocks: int) -> RoutingKey:
    """A conversation's prompt of ``blocks`` 16-token blocks (a longer one continues it)."""
    return key_from_blocks(
        tuple(range(1, blocks + 1)),
        block_size=16,
        units=16 * blocks,
        prompt_tokens=16 * blocks,
        prefix_length=64,
        seed=7,
        output_tokens_hint=50,
    )


def _view(replica: str = "r0", ids: Sequence[InstanceId] = IDS) -> tuple[ReplicaView, Recorder]:
    recorder = Recorder()
    view = ReplicaView(replica, "v", recorder)
    view.on_instances_changed(ids)
    return view, recorder


def _peer_notes(origin: str, count: int) -> list[RoutedNote]:
    peer, _ = _view(origin)
    return [peer.routed(_key(n), Decision(IDS[n % 3], Reason.NO_MATCH)) for n in range(count)]


def test_own_routing_is_learnt_counted_and_numbered() -> None:
    view, recorder = _view()
    first = view.routed(_key(1), Decision("a", Reason.NO_MATCH))
    second = view.routed(_key(2, tokens=50, output=5), Decision("a", Reason.PREFIX_HIT, 2, 2))
    assert (first.origin, first.variant, first.seq, second.seq) == ("r0", "v", 1, 2)
    assert recorder.routed == [(_key(1), first.decision), (_key(2, 50, 5), second.decision)]
    assert view.in_flight_requests["a"] == 2
    assert view.in_flight_tokens["a"] == 110 + 55
    done = view.finished(first)
    assert done == FinishedNote("r0", "v", 1, "a", 110)
    assert (view.in_flight_requests["a"], view.in_flight_tokens["a"]) == (1, 55)
    assert view.apply(first) is False  # its own note sent back: already applied
    assert view.in_flight_requests["a"] == 1


def test_peer_notes_teach_the_strategy_and_move_the_counts() -> None:
    view, recorder = _view()
    notes = _peer_notes("r1", 3)
    assert all(view.apply(n) for n in notes)
    assert recorder.routed == [(n.key, n.decision) for n in notes]
    assert view.in_flight_requests == {"a": 1, "b": 1, "c": 1}
    assert view.apply(notes[1]) is False  # duplicate
    assert view.apply(finished_note(notes[1])) is True
    assert view.apply(finished_note(notes[1])) is False  # duplicate end
    assert view.in_flight_requests == {"a": 1, "b": 0, "c": 1}
    assert view.in_flight_tokens == {"a": 110, "b": 0, "c": 110}
    assert view.open_requests() == {"r1": 2}
    other = RoutedNote("r1", "other-variant", 9, _key(9), Decision("a", Reason.RANDOM), 1)
    assert view.apply(other) is False
    assert len(recorder.routed) == 3


def test_an_end_before_its_routing_counts_nothing_but_the_routing_is_learnt() -> None:
    view, recorder = _view()
    (note,) = _peer_notes("r1", 1)
    assert view.apply(finished_note(note)) is True
    assert view.in_flight_requests.get("a", 0) == 0
    assert view.apply(note) is True
    assert recorder.routed == [(note.key, note.decision)]
    assert view.in_flight_requests.get("a", 0) == 0
    assert view.apply(note) is False
    assert view.apply(finished_note(note)) is False


def test_a_note_about_an_instance_not_routed_to_here_is_counted_not_learnt() -> None:
    view, recorder = _view(ids=("b", "c"))  # "a" left (or is not discovered here yet)
    (note,) = _peer_notes("r1", 1)
    assert note.instance_id == "a"
    assert view.apply(note) is True
    assert recorder.routed == []
    assert view.in_flight_requests["a"] == 1
    view.apply(finished_note(note))
    assert "a" not in view.in_flight_requests  # no entry left behind for a gone instance
    assert "a" not in view.in_flight_tokens


def test_forgetting_a_peer_drops_its_open_requests_but_not_what_was_learnt() -> None:
    view, recorder = _view()
    notes = _peer_notes("r1", 3)
    for note in notes:
        view.apply(note)
    view.forget_origin("r1")
    assert view.in_flight_requests == {"a": 0, "b": 0, "c": 0}
    assert len(recorder.routed) == 3
    assert view.apply(notes[0]) is False  # still applied once at most
    assert view.apply(finished_note(notes[0])) is False


def test_a_forgotten_origin_relayed_stays_forgotten_and_counts_nothing() -> None:
    """A dead peer's notes replayed from another peer's log (a duplicate, or one this replica
    missed) are learnt once but never count, and the origin's state still goes in time."""
    view, recorder = _view()
    notes = _peer_notes("dead", 4)
    for note in notes[:3]:  # the 4th was lost on the wire
        view.apply(note)
    view.forget_origin("dead")
    assert view.apply(notes[0]) is False  # a relayed duplicate
    assert view.apply(notes[3]) is True  # relayed, missed before: learnt...
    assert len(recorder.routed) == 4
    assert sum(view.in_flight_requests.values()) == 0  # ...and not counted
    assert view.open_requests()["dead"] == 0
    for run in range(FORGOTTEN_ORIGINS):
        view.apply(_peer_notes(f"r#{run}", 1)[0])
        view.forget_origin(f"r#{run}")
    assert "dead" not in view.open_requests()  # not revived by the relayed notes: evicted


def test_an_end_heard_before_its_routing_survives_forgetting_its_origin() -> None:
    view, _ = _view()
    (note,) = _peer_notes("p", 1)
    view.apply(finished_note(note))  # the end first (live), the routing to come (a replay)
    view.forget_origin("p")
    view.revive("p")
    assert view.apply(note) is True  # learnt...
    assert sum(view.in_flight_requests.values()) == 0  # ...but it ended: not counted
    assert view.open_requests()["p"] == 0


def test_a_revived_origin_counts_its_requests_still_open_again() -> None:
    """Forgotten while its requests ran (a partition), heard again: those its catch-up answer
    lists as open count again; one that ended meanwhile does not; a later end balances."""
    view, recorder = _view()
    notes = _peer_notes("p", 3)
    for note in notes:
        view.apply(note)
    counted = dict(view.in_flight_requests)
    view.forget_origin("p")
    assert sum(view.in_flight_requests.values()) == 0
    assert view.apply(notes[0]) is False  # relayed while forgotten: stays dormant
    view.revive("p")
    assert view.apply(finished_note(notes[1])) is False  # ended during the partition
    assert view.apply(notes[0]) is True  # listed as open
    assert view.apply(notes[2]) is True
    assert view.apply(notes[1]) is False  # its routing replayed after its end: nothing
    expected = Counter(counted)
    expected[notes[1].instance_id] -= 1
    assert view.in_flight_requests == dict(expected)
    assert len(recorder.routed) == 3  # learnt once each
    for note in (notes[0], notes[2]):
        assert view.apply(finished_note(note)) is True
    assert sum(view.in_flight_requests.values()) == 0


def test_state_of_forgotten_origins_is_bounded_over_any_number_of_restarts() -> None:
    """Each restart of a peer is a new origin: once more than FORGOTTEN_ORIGINS were forgotten,
    the oldest one's state goes whole; one heard again (a healed partition) is kept."""
    view, _ = _view()
    view.apply(_peer_notes("healed", 1)[0])
    view.forget_origin("healed")
    view.revive("healed")  # heard again: alive
    view.apply(_peer_notes("healed", 2)[1])
    for run in range(FORGOTTEN_ORIGINS + 10):
        origin = f"r1#{run}"
        view.apply(_peer_notes(origin, 1)[0])
        view.forget_origin(origin)
    origins = set(view.open_requests())
    assert len(origins) == FORGOTTEN_ORIGINS + 1  # the forgotten ones kept, plus "healed"
    assert "healed" in origins
    assert "r1#0" not in origins
    assert f"r1#{FORGOTTEN_ORIGINS + 9}" in origins


def test_seq_window_is_bounded_and_exact_inside_its_limit() -> None:
    window = SeqWindow(limit=4)
    assert [window.add(s) for s in (2, 1, 2, 3)] == [True, True, False, True]
    assert (window.floor, window.above) == (4, set())
    assert all(window.add(s) for s in (10, 12, 14, 16))
    assert window.add(18)  # a fifth number past the gap: the floor jumps to the oldest
    assert len(window.above) <= 4
    assert 5 in window  # more than the limit behind: counted as seen, dropped if it comes


def _reference_add(window: SeqWindow, seq: int) -> bool:
    """``SeqWindow.add`` without its in-order shortcut: the rule as stated."""
    if seq in window:
        return False
    window.above.add(seq)
    if len(window.above) > window.limit:
        window.floor = min(window.above)
    while window.floor in window.above:
        window.above.remove(window.floor)
        window.floor += 1
    return True


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.lists(st.integers(0, 40), max_size=60))
def test_seq_window_in_order_shortcut_keeps_the_rule(limit: int, seqs: list[int]) -> None:
    fast, reference = SeqWindow(limit=limit), SeqWindow(limit=limit)
    for seq in [*range(1, 6), *seqs, *range(41, 45)]:  # in order, shuffled, in order again
        assert fast.add(seq) == _reference_add(reference, seq)
        assert (fast.floor, fast.above) == (reference.floor, reference.above)


def test_open_requests_per_origin_are_bounded() -> None:
    view = ReplicaView("r0", "v", Recorder(), window=2)
    view.on_instances_changed(IDS)
    for note in _peer_notes("r1", 5):  # their ends were lost
        view.apply(note)
    assert view.open_requests() == {"r1": 2}
    assert sum(view.in_flight_requests.values()) == 2


def test_peer_notes_make_a_prefix_affinity_replica_follow_the_conversation() -> None:
    """Replica r1 never saw turn 1; once r0's note arrives it sends turn 2 to turn 1's
    instance, as r0 would (the same strategy class, fed the same way)."""
    config = strategy_config("prefix_affinity")
    r0 = ReplicaView("r0", "v", build_strategy(config, random.Random(0)))
    r1 = ReplicaView("r1", "v", build_strategy(config, random.Random(1)))
    ids = tuple(f"i{n}" for n in range(8))
    for view in (r0, r1):
        view.on_instances_changed(ids)
    turn1, turn2 = _chain(40), _chain(60)
    fleet = FleetSnapshot(tuple(InstanceState(i) for i in ids))
    first = r0.strategy.choose(turn1, fleet)
    note = r0.routed(turn1, first)
    alone = r1.strategy.choose(turn2, fleet)
    assert alone.reason is Reason.NO_MATCH
    r1.apply(note)
    synced = r1.strategy.choose(turn2, fleet)
    assert (synced.instance_id, synced.reason) == (first.instance_id, Reason.PREFIX_HIT)


# (origin, request number, whether it ended): the notes one run of peers sent
_request_st = st.tuples(st.sampled_from(["r1", "r2"]), st.integers(0, 15), st.booleans())


def _sent(requests: list[tuple[str, int, bool]]) -> tuple[list[SyncNote], Counter[str]]:
    """Each peer's routed notes (one per distinct request) and the ends of those that ended;
    the expected open count per instance."""
    notes: list[SyncNote] = []
    expected: Counter[str] = Counter()
    views = {origin: ReplicaView(origin, "v", Recorder()) for origin in ("r1", "r2")}
    for origin, n, ended in {(o, n): (o, n, e) for o, n, e in requests}.values():
        routed = views[origin].routed(_key(n), Decision(IDS[n % 3], Reason.NO_MATCH))
        notes.append(routed)
        if ended:
            notes.append(finished_note(routed))
        else:
            expected[routed.instance_id] += 1
    return notes, expected


@settings(max_examples=150, deadline=None)
@given(st.lists(_request_st, max_size=20), st.randoms(use_true_random=False), st.data())
def test_duplicates_and_reordering_do_not_change_the_final_state(
    requests: list[tuple[str, int, bool]], rng: random.Random, data: st.DataObject
) -> None:
    notes, expected = _sent(requests)
    delivered = notes + data.draw(
        st.lists(st.sampled_from(notes), max_size=10) if notes else st.just([])
    )
    rng.shuffle(delivered)
    view, recorder = _view()
    for note in delivered:
        view.apply(note)
        assert min(view.in_flight_requests.values(), default=0) >= 0
        assert min(view.in_flight_tokens.values(), default=0) >= 0
    assert {i: n for i, n in view.in_flight_requests.items() if n} == dict(expected)
    assert {i: t for i, t in view.in_flight_tokens.items() if t} == {
        i: 110 * n for i, n in expected.items()
    }
    routed = [n for n in notes if isinstance(n, RoutedNote)]
    assert Counter(recorder.routed) == Counter((n.key, n.decision) for n in routed)


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window"):
        ReplicaView("r0", "v", Recorder(), window=0)
