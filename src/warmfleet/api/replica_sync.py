"""The gateway replicas' sync wire format: the one definition of how the notes of
``routing.replica_notes`` (``RoutedNote``, ``FinishedNote``) travel between replicas.

**Encoding.** msgpack (already a dependency: the KV-event wire uses it), chosen over JSON for
size and speed: a payload is one batch ``[VERSION, [note, ...]]``, a note an array

- routed: ``[0, origin, variant, seq, block_hashes, block_size, units, prompt_tokens,
  prefix_hash, output_tokens_hint, chain_seed | nil, session | nil, instance_id, reason,
  predicted_cached_blocks, best_cached_blocks, spilled, tokens]``, where ``block_hashes`` is
  one bytes value of 8-byte little-endian unsigned hashes (8 bytes a block instead of msgpack's
  9, packed and unpacked in C) and ``reason`` the ``Reason`` value (``"prefix_hit"``...; the
  member itself is packed: a ``StrEnum`` is a ``str``, and ``.value`` is an interpreted
  property call a note);
- finished: ``[1, origin, variant, seq, instance_id, tokens]``.

Every field is positional; a reader refuses another ``VERSION`` (2: version 1 had no
``session``). ``decode_batch`` raises
``ReplicaSyncError`` for anything that is not a batch of this version, never another exception.

**Bounded staleness.** There is no leader: each replica applies its own decisions at once and
its peers' notes when they arrive (``routing.replicas.ReplicaView``). If every note reaches every
peer within ``D`` seconds of the decision (transport latency plus any batching interval), a
replica deciding at ``t`` knows every routing and completion of the fleet made before ``t - D``:
its prefix index, fan-out, prompt ends and in-flight load lag the fleet's by at most ``D``, and
two replicas can only disagree about requests routed within ``D`` of each other. The
simulator (``warmfleet sim --gateway-replicas N --sync-delay-ms D``) measures what a given
``D`` costs in hit rate; a replica cut off from its peers degrades to its own view (``D``
infinite, the "no sync" column of that table).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import msgpack

from warmfleet.core.errors import WarmfleetError
from warmfleet.core.types import Decision, Reason, RoutingKey
from warmfleet.routing.replica_notes import FinishedNote, RoutedNote, SyncNote

VERSION = 2
MAX_BATCH_NOTES = 65_536  # the most notes a payload carries (spec.replicaSync.maxBatchNotes)
DEFAULT_LOG_BYTES = 32 << 20  # what each replica keeps for newcomers (spec.replicaSync.logBytes)
# the longest a note waits for its batch under load (spec.replicaSync.batchIntervalMs)
DEFAULT_BATCH_INTERVAL_MS = 5.0
_ROUTED, _FINISHED = 0, 1
_ROUTED_FIELDS = 18
_FINISHED_FIELDS = 6
_U64 = (1 << 64) - 1
_I64 = (-(1 << 63), (1 << 63) - 1)
_MAX_I64 = _I64[1]
_REASONS = {reason.value: reason for reason in Reason}
_PACKER_START_BYTES = 16 << 10  # a batch of ~25 notes of 8,000-character prompts
# Compiled formats of 0..64 hashes: a longer chain is packed 64 at a time. ``struct.pack`` with
# a format built per call looks the format up in struct's cache first: ~0.5 µs a call at 62
# hashes, as much as packing them (measured).
_CHUNK = 64
_U64S = tuple(struct.Struct(f"<{n}Q") for n in range(_CHUNK + 1))
_CHUNK_BYTES = 8 * _CHUNK


class ReplicaSyncError(WarmfleetError):
    """A note that cannot be encoded, or a payload that is not a batch of sync notes."""


def _hashes_bytes(hashes: tuple[int, ...]) -> bytes:
    n = len(hashes)
    try:
        if n <= _CHUNK:
            return _U64S[n].pack(*hashes)
        whole = n - n % _CHUNK
        full = _U64S[_CHUNK]
        parts = [full.pack(*hashes[i : i + _CHUNK]) for i in range(0, whole, _CHUNK)]
        parts.append(_U64S[n - whole].pack(*hashes[whole:]))
    except struct.error as err:
        raise ReplicaSyncError(f"block_hashes: not unsigned 64-bit hashes: {err}") from err
    return b"".join(parts)


def _hashes(raw: bytes) -> tuple[int, ...]:
    """The hashes of ``_hashes_bytes``' ``raw`` (a whole number of 8-byte hashes)."""
    size = len(raw)
    if size <= _CHUNK_BYTES:
        return _U64S[size >> 3].unpack(raw)
    whole = size - size % _CHUNK_BYTES
    full = _U64S[_CHUNK]
    out: list[int] = []
    for offset in range(0, whole, _CHUNK_BYTES):
        out += full.unpack_from(raw, offset)
    out += _U64S[(size - whole) >> 3].unpack_from(raw, whole)
    return tuple(out)


def _note_fields(note: SyncNote) -> list[Any]:
    if isinstance(note, FinishedNote):
        return [_FINISHED, note.origin, note.variant, note.seq, note.instance_id, note.tokens]
    key, decision = note.key, note.decision
    return [
        _ROUTED, note.origin, note.variant, note.seq,
        _hashes_bytes(key.block_hashes), key.block_size, key.units, key.prompt_tokens,
        key.prefix_hash, key.output_tokens_hint, key.chain_seed, key.session,
        decision.instance_id, decision.reason, decision.predicted_cached_blocks,
        decision.best_cached_blocks, decision.spilled, note.tokens,
    ]  # fmt: skip


class BatchEncoder:
    """Encodes payloads with one ``msgpack.Packer`` kept from batch to batch (its buffer grows
    to the largest batch and stays). ``msgpack.packb`` builds a Packer, and allocates its
    256 KiB buffer, at every call: ~20 µs more a batch of two notes with cold caches, measured,
    which a replica pays for every request when it routes one at a time."""

    __slots__ = ("_packer",)

    def __init__(self) -> None:
        self._packer: Any = msgpack.Packer(use_bin_type=True, buf_size=_PACKER_START_BYTES)

    def encode(self, notes: Sequence[SyncNote]) -> bytes:
        """One payload carrying ``notes`` in order."""
        try:  # (a failed pack leaves the Packer empty: the next one starts clean)
            payload: bytes = self._packer.pack([VERSION, [_note_fields(n) for n in notes]])
        except (OverflowError, ValueError, TypeError) as err:  # an int past 64 bits
            raise ReplicaSyncError(f"note: cannot encode: {err}") from err
        return payload

    def encode_valid(self, notes: Sequence[SyncNote]) -> tuple[bytes, int]:
        """One payload of the notes that can be encoded (a note that cannot, a bug, must not
        take the others with it), and how many were left out."""
        try:
            return self.encode(notes), 0
        except ReplicaSyncError:
            good = [n for n in notes if self._encodes(n)]
            return self.encode(good), len(notes) - len(good)

    def _encodes(self, note: SyncNote) -> bool:
        try:
            self.encode((note,))
        except ReplicaSyncError:
            return False
        return True


def _int(value: object, name: str, low: int = 0, high: int = _I64[1]) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ReplicaSyncError(f"{name}: expected an integer in [{low}, {high}], got {value!r}")
    return value


def _str(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise ReplicaSyncError(f"{name}: expected a string, got {value!r}")
    return value


def _head(fields: list[Any]) -> tuple[str, str, int]:
    return _str(fields[1], "origin"), _str(fields[2], "variant"), _int(fields[3], "seq", 1)


def _hash(value: object) -> bool:
    """An ``int`` in ``[-2**63, 2**64)`` (what ``_int`` accepts for a hash)."""
    return type(value) is int and _I64[0] <= value <= _U64


def _routed_fast(fields: list[Any]) -> RoutedNote | None:
    """``_decode_routed`` of a valid note, without its per-field checks and messages (a
    batch's notes are decoded by the peer of every replica: ~45 % of a note's decoding);
    ``None`` when any field is off (the checked path then names it)."""
    (
        _kind, origin, variant, seq, raw, block_size, units, prompt_tokens, prefix_hash,
        hint, seed, session, instance_id, reason, predicted, best, spilled, tokens,
    ) = fields  # fmt: skip
    if not (
        type(origin) is str
        and type(variant) is str
        and type(instance_id) is str
        and type(raw) is bytes
        and not len(raw) % 8
        and type(spilled) is bool
        and type(reason) is str
        and reason in _REASONS
        and type(seq) is int
        and type(block_size) is int
        and type(units) is int
        and type(prompt_tokens) is int
        and type(hint) is int
        and type(predicted) is int
        and type(best) is int
        and type(tokens) is int
        and 1 <= seq <= _MAX_I64
        and min(block_size, units, prompt_tokens, hint, predicted, best, tokens) >= 0
        and max(block_size, units, prompt_tokens, hint, predicted, best, tokens) <= _MAX_I64
        and _hash(prefix_hash)
        and (seed is None or _hash(seed))
        and (session is None or _hash(session))
    ):
        return None
    hashes = _hashes(raw)
    key = RoutingKey(hashes, block_size, units, prompt_tokens, prefix_hash, hint, seed, session)
    decision = Decision(instance_id, _REASONS[reason], predicted, best, spilled)
    return RoutedNote(origin, variant, seq, key, decision, tokens)


def _decode_routed(fields: list[Any]) -> RoutedNote:
    return _routed_fast(fields) or _routed_checked(fields)


def _routed_checked(fields: list[Any]) -> RoutedNote:
    """A routed note, each field checked in turn (the error names the first one off)."""
    origin, variant, seq = _head(fields)
    raw = fields[4]
    if not isinstance(raw, bytes) or len(raw) % 8:
        raise ReplicaSyncError("block_hashes: expected bytes of 8-byte hashes")
    seed, session = fields[10], fields[11]
    key = RoutingKey(
        block_hashes=_hashes(raw),
        block_size=_int(fields[5], "block_size"),
        units=_int(fields[6], "units"),
        prompt_tokens=_int(fields[7], "prompt_tokens"),
        prefix_hash=_int(fields[8], "prefix_hash", _I64[0], _U64),
        output_tokens_hint=_int(fields[9], "output_tokens_hint"),
        chain_seed=None if seed is None else _int(seed, "chain_seed", _I64[0], _U64),
        session=None if session is None else _int(session, "session", _I64[0], _U64),
    )
    try:
        reason = Reason(fields[13])
    except (ValueError, TypeError) as err:  # TypeError: an unhashable value
        raise ReplicaSyncError(f"reason: unknown {fields[13]!r}") from err
    if not isinstance(fields[16], bool):
        raise ReplicaSyncError(f"spilled: expected a boolean, got {fields[16]!r}")
    decision = Decision(
        _str(fields[12], "instance_id"),
        reason,
        _int(fields[14], "predicted_cached_blocks"),
        _int(fields[15], "best_cached_blocks"),
        fields[16],
    )
    return RoutedNote(origin, variant, seq, key, decision, _int(fields[17], "tokens"))


def _decode_note(fields: object) -> SyncNote:
    if not isinstance(fields, list) or not fields:
        raise ReplicaSyncError(f"note: expected a non-empty array, got {fields!r}")
    kind = fields[0]
    if kind == _ROUTED and type(kind) is int and len(fields) == _ROUTED_FIELDS:
        return _decode_routed(fields)
    if kind == _FINISHED and type(kind) is int and len(fields) == _FINISHED_FIELDS:
        origin, variant, seq = _head(fields)
        instance_id = _str(fields[4], "instance_id")
        return FinishedNote(origin, variant, seq, instance_id, _int(fields[5], "tokens"))
    raise ReplicaSyncError(f"note: unknown kind or field count: {fields[:1]!r}, {len(fields)}")


class _ArrayBudget:
    """``list_hook`` of ``decode_batch``: a batch has one array per note and two more, so past
    that many the payload is refused at once (a frame of 8 MB of nested empty arrays, each one
    byte, was ~700 MB of lists and seconds of the event loop before it was refused)."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_BATCH_NOTES + 2

    def __call__(self, items: list[Any]) -> list[Any]:
        self.left -= 1
        if self.left < 0:
            raise ValueError(f"more arrays than a batch of {MAX_BATCH_NOTES} notes has")
        return items


def decode_batch(payload: bytes) -> tuple[SyncNote, ...]:
    """The notes of one payload, in order."""
    try:
        raw = msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=False,
            max_array_len=MAX_BATCH_NOTES,
            max_map_len=0,  # a batch holds no map
            list_hook=_ArrayBudget(),
        )
    except (ValueError, TypeError, msgpack.UnpackException) as err:  # TypeError: a list as key
        raise ReplicaSyncError(f"payload: not msgpack: {err}") from err
    if not isinstance(raw, list) or len(raw) != 2 or not isinstance(raw[1], list):
        raise ReplicaSyncError("payload: expected [version, [note, ...]]")
    if raw[0] != VERSION or type(raw[0]) is not int:
        raise ReplicaSyncError(f"payload: version {raw[0]!r}, this reader speaks {VERSION}")
    return tuple(_decode_note(fields) for fields in raw[1])
