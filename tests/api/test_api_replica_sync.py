"""The replica-sync wire format: every field round-trips, anything else is one error type."""

from __future__ import annotations

import contextlib
import struct
from dataclasses import fields, replace

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.api.replica_sync import (
    MAX_BATCH_NOTES,
    VERSION,
    BatchEncoder,
    ReplicaSyncError,
    _routed_checked,
    _routed_fast,
    decode_batch,
)
from warmfleet.core.types import Decision, Reason, RoutingKey
from warmfleet.routing.replica_notes import FinishedNote, RoutedNote, SyncNote, routed_note

U64 = st.integers(0, (1 << 64) - 1)
COUNT = st.integers(0, 1 << 40)
NAME = st.text(max_size=20)

key_st = st.builds(
    RoutingKey,
    block_hashes=st.lists(U64, max_size=40).map(tuple),
    block_size=COUNT,
    units=COUNT,
    prompt_tokens=COUNT,
    prefix_hash=U64,
    output_tokens_hint=COUNT,
    chain_seed=st.none() | U64,
    session=st.none() | U64,
)
decision_st = st.builds(
    Decision,
    instance_id=NAME,
    reason=st.sampled_from(Reason),
    predicted_cached_blocks=COUNT,
    best_cached_blocks=COUNT,
    spilled=st.booleans(),
)
SEQ = st.integers(1, (1 << 63) - 1)
note_st: st.SearchStrategy[SyncNote] = st.one_of(
    st.builds(RoutedNote, NAME, NAME, SEQ, key_st, decision_st, COUNT),
    st.builds(FinishedNote, NAME, NAME, SEQ, NAME, COUNT),
)


def test_the_codec_covers_every_field_of_the_key_and_the_decision() -> None:
    """A field added to RoutingKey or Decision must be added to the wire (and to key_st /
    decision_st above, which the round trip draws every field of)."""
    assert [f.name for f in fields(RoutingKey)] == [
        "block_hashes", "block_size", "units", "prompt_tokens", "prefix_hash",
        "output_tokens_hint", "chain_seed", "session",
    ]  # fmt: skip
    assert [f.name for f in fields(Decision)] == [
        "instance_id", "reason", "predicted_cached_blocks", "best_cached_blocks", "spilled",
    ]  # fmt: skip


def test_a_batch_round_trips() -> None:
    key = RoutingKey((1, 2, (1 << 64) - 1), 16, 50, 50, 99, 8, None)
    routed = routed_note("r0", "llama", 7, key, Decision("i1", Reason.PREFIX_HIT, 2, 3, True))
    done = FinishedNote("r0", "llama", 7, "i1", routed.tokens)
    payload = BatchEncoder().encode([routed, done])
    assert decode_batch(payload) == (routed, done)
    assert decode_batch(BatchEncoder().encode([])) == ()
    with_session = replace(routed, key=replace(key, session=(1 << 64) - 2))
    assert decode_batch(BatchEncoder().encode([with_session])) == (with_session,)
    # 8 bytes a block hash: the chain dominates a long prompt's note
    long = replace(routed, key=replace(key, block_hashes=tuple(range(1 << 40, (1 << 40) + 2048))))
    assert len(BatchEncoder().encode([long])) < 8 * 2048 + 100


@pytest.mark.parametrize("blocks", [0, 1, 63, 64, 65, 127, 128, 129, 200])
def test_a_chain_of_any_length_is_its_hashes_as_8_byte_little_endian_words(blocks: int) -> None:
    """Chains longer than the codec's precompiled formats (64 hashes) are packed and unpacked
    in pieces: the same bytes as one format of their length, and the same hashes back."""
    hashes = tuple((i * 0x9E3779B97F4A7C15) % (1 << 64) for i in range(1, blocks + 1))
    key = RoutingKey(hashes, 16, 16 * blocks, 16 * blocks, 5)
    note = routed_note("r0", "v", 1, key, Decision("i", Reason.PREFIX_HIT, blocks))
    payload = BatchEncoder().encode([note])
    if blocks:
        assert struct.pack(f"<{blocks}Q", *hashes) in payload
    assert decode_batch(payload) == (note,)
    too_big = replace(key, block_hashes=(*hashes, 1 << 64))
    with pytest.raises(ReplicaSyncError, match="block_hashes"):
        BatchEncoder().encode([replace(note, key=too_big)])


@settings(max_examples=100, deadline=None)
@given(st.lists(note_st, max_size=5))
def test_any_notes_round_trip(notes: list[SyncNote]) -> None:
    assert decode_batch(BatchEncoder().encode(notes)) == tuple(notes)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(note_st, max_size=4), min_size=1, max_size=4))
def test_an_encoder_kept_from_batch_to_batch_encodes_each_as_a_new_one(
    batches: list[list[SyncNote]],
) -> None:
    """One ``BatchEncoder`` for a stream of batches, one of them refused half-way (an int past
    64 bits after other fields were packed): each payload is what a new encoder makes."""
    encoder = BatchEncoder()
    too_big = replace(_note_with_session(), tokens=1 << 64)
    for notes in batches:
        with pytest.raises(ReplicaSyncError, match="cannot encode"):
            encoder.encode([*notes, too_big])
        assert encoder.encode(notes) == BatchEncoder().encode(notes)
        assert decode_batch(encoder.encode(notes)) == tuple(notes)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_the_one_error(payload: bytes) -> None:
    with contextlib.suppress(ReplicaSyncError):
        decode_batch(payload)


_value_st = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 63), (1 << 64) - 1)  # what msgpack can carry
    | st.sampled_from([0, 1, 7])
    | st.text(max_size=5)
    | st.binary(max_size=9),
    lambda inner: st.lists(inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(_value_st, max_size=19), max_size=2))
def test_malformed_notes_raise_the_one_error(notes: list[list[object]]) -> None:
    payload = msgpack.packb([VERSION, notes], use_bin_type=True)
    with contextlib.suppress(ReplicaSyncError):
        decode_batch(payload)


def test_what_cannot_be_sent_or_read_is_named() -> None:
    key = RoutingKey((1 << 64,), 16, 16, 16, 0)
    with pytest.raises(ReplicaSyncError, match="block_hashes"):
        BatchEncoder().encode([routed_note("r0", "v", 1, key, Decision("i", Reason.RANDOM))])
    with pytest.raises(ReplicaSyncError, match="version"):
        decode_batch(msgpack.packb([VERSION + 1, []]))
    finished = [1, "r0", "v", 0, "i", 5]  # sequence numbers start at 1
    with pytest.raises(ReplicaSyncError, match="seq"):
        decode_batch(msgpack.packb([VERSION, [finished]]))
    with pytest.raises(ReplicaSyncError, match="payload"):
        decode_batch(b"\xc1")
    (routed,) = msgpack.unpackb(BatchEncoder().encode([_note_with_session()]))[1]
    routed[11] = "s"  # the session is a 64-bit hash or nil
    with pytest.raises(ReplicaSyncError, match="session"):
        decode_batch(msgpack.packb([VERSION, [routed]], use_bin_type=True))


def test_a_note_that_cannot_be_encoded_does_not_take_its_batch_with_it() -> None:
    too_wide = RoutingKey((1 << 64,), 16, 16, 16, 0)
    bad = routed_note("r0", "v", 2, too_wide, Decision("i", Reason.RANDOM))
    good: list[SyncNote] = [_note_with_session(), FinishedNote("r0", "v", 1, "i", 5)]
    payload, left_out = BatchEncoder().encode_valid([good[0], bad, good[1]])
    assert left_out == 1
    assert decode_batch(payload) == tuple(good)
    assert BatchEncoder().encode_valid(good) == (BatchEncoder().encode(good), 0)


def _note_with_session() -> RoutedNote:
    key = RoutingKey((1, 2), 16, 32, 32, 5, 0, 9, session=77)
    return routed_note("r0", "v", 1, key, Decision("i", Reason.SESSION))


@settings(max_examples=150, deadline=None)
@given(note_st, st.integers(0, 17), _value_st)
def test_a_note_with_one_field_replaced_decodes_or_raises_the_one_error(
    note: SyncNote, position: int, value: object
) -> None:
    (fields_,) = msgpack.unpackb(BatchEncoder().encode([note]))[1]
    fields_[position % len(fields_)] = value
    with contextlib.suppress(ReplicaSyncError):
        decode_batch(msgpack.packb([VERSION, [fields_]], use_bin_type=True))


routed_st = st.builds(RoutedNote, NAME, NAME, SEQ, key_st, decision_st, COUNT)


@settings(max_examples=200, deadline=None)
@given(routed_st, st.integers(1, 17), _value_st)
def test_the_fast_decoding_of_a_routed_note_is_the_checked_one(
    note: RoutedNote, position: int, value: object
) -> None:
    """Valid or not, a routed note decodes alike with and without the per-field checks (the
    fast path declines what the checked path refuses, which then names the field)."""
    (fields_,) = msgpack.unpackb(BatchEncoder().encode([note]))[1]
    assert _routed_fast(fields_) == _routed_checked(fields_) == note
    fields_[position] = value
    fields_ = msgpack.unpackb(msgpack.packb(fields_, use_bin_type=True))
    try:
        checked = _routed_checked(fields_)
    except ReplicaSyncError:
        assert _routed_fast(fields_) is None
    else:
        assert _routed_fast(fields_) == checked


@pytest.mark.parametrize(
    "garbage",
    [
        [VERSION, [[]] * 100_000],  # more notes than a batch carries
        [VERSION, [[[]] * 60_000 for _ in range(30)]],  # nested: more arrays than notes
        [VERSION, [{"a": 1}]],  # a batch holds no map
    ],
)
def test_a_payload_of_nested_garbage_is_refused_before_it_is_built(garbage: object) -> None:
    """An 8 MB frame of one-byte empty arrays was ~700 MB of lists before it was refused."""
    with pytest.raises(ReplicaSyncError, match="payload: not msgpack"):
        decode_batch(msgpack.packb(garbage))


def test_the_largest_batch_decodes() -> None:
    note = _note_with_session()
    batch = BatchEncoder().encode([note] * MAX_BATCH_NOTES)
    assert len(decode_batch(batch)) == MAX_BATCH_NOTES
