"""Decoding (and, for tests and emulators, encoding) of vLLM's ZMQ KV-event frames."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgpack  # type: ignore[import-untyped]

from warmfleet.core.errors import WarmfleetError
from warmfleet.core.types import InstanceId

EngineHash = int | bytes
Mode = Literal["exact", "approximate"]
TOPIC_PREFIX = "kv."


class KvEventDecodeError(WarmfleetError):
    """A frame that is not a vLLM KV event batch."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[EngineHash, ...]
    parent_block_hash: EngineHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[EngineHash, ...]
    medium: str | None = None


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


_FIELDS: dict[str, tuple[str, ...]] = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
    ),
    "BlockRemoved": ("block_hashes", "medium"),
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
            return BlockStored(
                tuple(_hash(h) for h in f["block_hashes"]),
                None if parent is None else _hash(parent),
                tuple(int(t) for t in f["token_ids"]),
                int(f["block_size"]),
                f.get("lora_id"),
                f.get("medium"),
            )
        if tag == "BlockRemoved":
            return BlockRemoved(tuple(_hash(h) for h in f["block_hashes"]), f.get("medium"))
    except (ValueError, TypeError, KeyError) as err:
        raise KvEventDecodeError(f"malformed {tag} event: {err!r}") from err
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise KvEventDecodeError(f"unknown event tag {tag!r}")


def decode_batch(payload: bytes) -> EventBatch:
    """Decode one msgpack ``EventBatch`` (array form; unknown trailing fields ignored)."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as err:
        raise KvEventDecodeError(f"not msgpack: {err}") from err
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise KvEventDecodeError("event batch must be [ts, [events...], dp_rank?]")
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
                }
            )
        elif isinstance(ev, BlockRemoved):
            events.append(
                {"type": "BlockRemoved", "block_hashes": list(ev.block_hashes), "medium": ev.medium}
            )
        else:
            events.append({"type": "AllBlocksCleared"})
    return bytes(msgpack.packb([batch.ts, events, batch.data_parallel_rank]))


def encode_frames(topic: str, seq: int, batch: EventBatch) -> list[bytes]:
    return [topic.encode(), seq.to_bytes(8, "big", signed=True), encode_batch(batch)]


def instance_of_topic(topic: str, prefix: str = TOPIC_PREFIX) -> InstanceId | None:
    """``kv.<instance-id>`` -> the instance id (other topics are not ours)."""
    return topic[len(prefix) :] if topic.startswith(prefix) and len(topic) > len(prefix) else None
