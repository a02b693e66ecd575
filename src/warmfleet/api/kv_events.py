"""vLLM's ZMQ KV-event wire format: the one definition the gateway (decoding) and the emulated
engines (encoding) share.

A message is three frames ``[topic, seq (8-byte big-endian), payload]``; the payload is a msgpack
``EventBatch`` ``[ts, events, data_parallel_rank]``. vLLM's publisher (msgspec, ``array_like``,
tagged) writes each event as an array ``[tag, field, ...]``:
``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, ...]``,
``["BlockRemoved", block_hashes, medium, ...]``, ``["AllBlocksCleared"]``; older publishers and
tests write maps tagged by ``type``. ``decode_*`` accept both; ``stored_event``/``extend_stored``,
``removed_event``, ``CLEARED_EVENT`` and ``pack_batch`` write the array form as vLLM does;
``encode_batch`` writes the map form (tests). The replay protocol (vLLM's ``replay_endpoint``):
a DEALER sends ``[b"", first seq]``; the ROUTER answers ``[b"", topic, seq, payload]`` per
buffered batch from there, then ``[b"", b"", END_SEQ, b""]``.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgpack

from warmfleet.core.errors import WarmfleetError
from warmfleet.core.types import InstanceId

EngineHash = int | bytes
Mode = Literal["exact", "approximate"]
TOPIC_PREFIX = "kv."
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # ends a replay answer
CLEARED_EVENT: tuple[str] = ("AllBlocksCleared",)


class KvEventDecodeError(WarmfleetError):
    """A frame that is not a vLLM KV event batch."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """``extra_keys``: vLLM's per-block extra hash keys (LoRA name, multimodal features, cache
    salt, prompt embeddings), one entry per block; None when no block has any. ``group_idx``
    and ``kv_cache_spec_kind``: the KV cache group the blocks belong to and its kind
    (``full_attention``, ``sliding_window``, ``mamba``...); a hybrid model has several."""

    block_hashes: tuple[EngineHash, ...]
    parent_block_hash: EngineHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: tuple[object, ...] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[EngineHash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[KvEvent, ...]
    data_parallel_rank: int | None = None


def _hash(value: object) -> EngineHash:
    if isinstance(value, bool) or not isinstance(value, int | bytes):
        raise KvEventDecodeError(f"block hash must be an int or bytes, got {type(value).__name__}")
    return value


def _hashes(value: object) -> tuple[EngineHash, ...]:
    if not isinstance(value, list):
        raise KvEventDecodeError(f"block_hashes must be an array, got {type(value).__name__}")
    return tuple(_hash(h) for h in value)


def _typed(value: object, kind: type, name: str) -> Any:
    """``value`` if it is None or a ``kind`` (never a bool for ``int``)."""
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    raise KvEventDecodeError(f"{name} must be {kind.__name__} or nil, got {type(value).__name__}")


def _token_ids(value: object) -> tuple[int, ...]:
    """Token ids as the router hashes them: uint64 (``array`` checks every id in C)."""
    if not isinstance(value, list):
        raise KvEventDecodeError("token_ids must be an array")
    return tuple(array("Q", value))


def _extra_keys(value: object) -> tuple[object, ...] | None:
    """One entry per block (None: no extra keys); None if no block has any."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise KvEventDecodeError("extra_keys must be an array or nil")
    return tuple(value) if any(value) else None


_FIELDS: dict[str, tuple[str, ...]] = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}


def _event_fields(raw: object) -> tuple[str, dict[str, Any]]:
    """vLLM sends tagged maps (``{"type": "BlockStored", ...}``); tagged arrays are accepted too."""
    if isinstance(raw, dict) and isinstance(raw.get("type"), str):
        return raw["type"], raw
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        names = _FIELDS.get(raw[0], ())
        return raw[0], dict(zip(names, raw[1:], strict=False))
    raise KvEventDecodeError("event must be a tagged map or array")


def _event(raw: object) -> KvEvent:
    tag, f = _event_fields(raw)
    try:
        if tag == "BlockStored":
            parent = f.get("parent_block_hash")
            block_size = f["block_size"]
            if not isinstance(block_size, int) or isinstance(block_size, bool):
                raise KvEventDecodeError(f"block_size must be an int, got {block_size!r}")
            return BlockStored(
                _hashes(f["block_hashes"]),
                None if parent is None else _hash(parent),
                _token_ids(f["token_ids"]),
                block_size,
                _typed(f.get("lora_id"), int, "lora_id"),
                _typed(f.get("medium"), str, "medium"),
                _typed(f.get("lora_name"), str, "lora_name"),
                _extra_keys(f.get("extra_keys")),
                _typed(f.get("group_idx"), int, "group_idx"),
                _typed(f.get("kv_cache_spec_kind"), str, "kv_cache_spec_kind"),
            )
        if tag == "BlockRemoved":
            medium = _typed(f.get("medium"), str, "medium")
            group = _typed(f.get("group_idx"), int, "group_idx")
            return BlockRemoved(_hashes(f["block_hashes"]), medium, group)
    except (ValueError, TypeError, KeyError, OverflowError) as err:
        raise KvEventDecodeError(f"malformed {tag} event: {err!r}") from err
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise KvEventDecodeError(f"unknown event tag {tag!r}")


def decode_batch(payload: bytes) -> EventBatch:
    """Decode one msgpack ``EventBatch`` (array form; unknown trailing fields ignored)."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as err:  # TypeError: a list as key
        raise KvEventDecodeError(f"not msgpack: {err}") from err
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise KvEventDecodeError("event batch must be [ts, [events...], dp_rank?]")
    if not isinstance(raw[0], int | float):  # msgpack ints (< 2**64) all fit a float
        raise KvEventDecodeError(f"event batch timestamp must be a number, got {raw[0]!r:.40}")
    rank = raw[2] if len(raw) > 2 and isinstance(raw[2], int) else None
    return EventBatch(float(raw[0]), tuple(_event(e) for e in raw[1]), rank)


def decode_frames(frames: Sequence[bytes]) -> tuple[str, int, EventBatch]:
    """``[topic, seq, payload]`` -> (topic, seq, batch)."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise KvEventDecodeError(f"expected [topic, 8-byte seq, payload], got {len(frames)} parts")
    topic = bytes(frames[0]).decode("utf-8", "replace")
    seq = int.from_bytes(frames[1], "big", signed=True)
    return topic, seq, decode_batch(bytes(frames[2]))


def encode_batch(batch: EventBatch) -> bytes:
    """The inverse of ``decode_batch``, in vLLM's layout (for tests and emulators)."""
    events: list[dict[str, Any]] = []
    for ev in batch.events:
        if isinstance(ev, BlockStored):
            events.append(
                {
                    "type": "BlockStored",
                    "block_hashes": list(ev.block_hashes),
                    "parent_block_hash": ev.parent_block_hash,
                    "token_ids": list(ev.token_ids),
                    "block_size": ev.block_size,
                    "lora_id": ev.lora_id,
                    "medium": ev.medium,
                    "lora_name": ev.lora_name,
                    "extra_keys": None if ev.extra_keys is None else list(ev.extra_keys),
                    "group_idx": ev.group_idx,
                    "kv_cache_spec_kind": ev.kv_cache_spec_kind,
                }
            )
        elif isinstance(ev, BlockRemoved):
            events.append(
                {
                    "type": "BlockRemoved",
                    "block_hashes": list(ev.block_hashes),
                    "medium": ev.medium,
                    "group_idx": ev.group_idx,
                }
            )
        else:
            events.append({"type": "AllBlocksCleared"})
    return bytes(msgpack.packb([batch.ts, events, batch.data_parallel_rank]))


def encode_frames(topic: str, seq: int, batch: EventBatch) -> list[bytes]:
    return [topic.encode(), seq.to_bytes(8, "big", signed=True), encode_batch(batch)]


def instance_of_topic(topic: str, prefix: str = TOPIC_PREFIX) -> InstanceId | None:
    """``kv.<instance-id>`` -> the instance id (other topics are not ours)."""
    return topic[len(prefix) :] if topic.startswith(prefix) and len(topic) > len(prefix) else None


def seq_bytes(seq: int) -> bytes:
    """A batch's sequence number as its 8-byte frame."""
    return seq.to_bytes(8, "big", signed=True)


def stored_event(
    block_hash: int, parent: int | None, tokens: list[int], block_size: int, medium: str
) -> list[object]:
    """One stored block as vLLM's array-form ``BlockStored`` (``extend_stored`` grows it)."""
    return ["BlockStored", [block_hash], parent, tokens, block_size, None, medium]


def extend_stored(
    event: Sequence[object], block_hash: int, parent: int | None, tokens: list[int]
) -> bool:
    """Append a block to an array-form ``BlockStored`` when it continues that event's chain
    (``parent`` is the event's last block): vLLM sends a chain of stored blocks as one event.
    False (nothing changed) otherwise."""
    if not event or event[0] != "BlockStored":
        return False
    hashes, token_ids = event[1], event[3]
    if not (isinstance(hashes, list) and hashes and hashes[-1] == parent):
        return False
    assert isinstance(token_ids, list)
    hashes.append(block_hash)
    token_ids.extend(tokens)
    return True


def removed_event(block_hashes: Sequence[int], medium: str) -> list[object]:
    """vLLM's array-form ``BlockRemoved``."""
    return ["BlockRemoved", list(block_hashes), medium]


def pack_batch(ts: float, events: Sequence[Sequence[object]], data_parallel_rank: int) -> bytes:
    """An array-form ``EventBatch`` payload, as vLLM's publisher packs it."""
    return bytes(msgpack.packb([ts, list(events), data_parallel_rank]))
