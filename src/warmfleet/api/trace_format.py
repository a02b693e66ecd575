"""warmfleet's trace format, version 1 (docs/trace-format.md): JSON lines, a superset of the
Mooncake trace, so Mooncake files load unchanged.

A record is one request: ``timestamp`` (ms since the trace's start), ``input_length`` and
``output_length`` (tokens), ``hash_ids`` (one id per block of ``block_tokens`` prompt tokens;
an equal id means an equal prefix chain up to that block). Optional fields say who sent it
(``tenant``, ``session``, ``priority``, ``deadline_ms``, ``model``, ``variant``) and, for captured
traffic, what happened live (``instance``, ``reason``, ``predicted_cached_tokens``,
``engine_cached_tokens``, ``ttft_ms``, ``e2e_ms``, ``status``, ``predicted_ttft_ms``).

An optional first line ``{"warmfleet_trace": 1, "block_tokens": ..., "fleet": {...}}`` carries
the block size and the fleet as captured; without it Mooncake's 512-token blocks are assumed.
Field names are the format's own (snake_case, as Mooncake's), not configuration keys. Unknown
fields are an error naming the line and the field.

The format carries no prompt text: a captured trace holds salted block hashes, lengths and
salted tenant/session hashes only (the gateway's capture writes it; this module only defines
and reads it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from warmfleet.core.errors import ConfigError

TRACE_VERSION = 1
MOONCAKE_BLOCK_TOKENS = 512  # the block size of a trace without a header
# Upper bounds of a record's token counts and of a header's sizes: far above any real model's
# context or fleet, low enough that a replay cannot hang hashing 10**20 tokens in blocks.
MAX_TOKENS = 1 << 27
MAX_INSTANCES = 10_000


class _Model(BaseModel):
    # strict: a number is a JSON number (lax mode took ``true`` as 1 and "12" as 12); the
    # fields holding an array or an object say ``strict=False`` (JSON has no tuple, no model)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


class TraceFleet(_Model):
    """The fleet a trace was captured on (each field optional): ``instances`` routable at the
    start, ``kv_capacity_tokens`` per instance when known, the ``strategy`` document of the
    variant (its ``type`` and parameters), the engine ``preset`` when it was one."""

    instances: int | None = Field(default=None, ge=1, le=MAX_INSTANCES)
    kv_capacity_tokens: int | None = Field(default=None, ge=1)
    strategy: dict[str, Any] | None = None
    preset: str | None = Field(default=None, min_length=1)


class TraceHeader(_Model):
    warmfleet_trace: int = Field(default=TRACE_VERSION, ge=1, le=TRACE_VERSION)
    block_tokens: int = Field(default=MOONCAKE_BLOCK_TOKENS, ge=1, le=MAX_TOKENS)
    fleet: TraceFleet = Field(default=TraceFleet(), strict=False)  # (a JSON object)


class TraceRecord(_Model):
    timestamp: float = Field(ge=0)
    input_length: int = Field(ge=0, le=MAX_TOKENS)
    output_length: int = Field(ge=0, le=MAX_TOKENS)
    hash_ids: tuple[StrictInt, ...] = Field(default=(), strict=False)  # (a JSON array)
    tenant: str | None = Field(default=None, max_length=256)
    session: str | None = Field(default=None, max_length=256)
    priority: int | None = None
    deadline_ms: float | None = Field(default=None, gt=0)
    model: str | None = Field(default=None, max_length=512)
    variant: str | None = Field(default=None, max_length=256)
    # what happened live (a capture)
    instance: str | None = Field(default=None, max_length=256)
    reason: str | None = Field(default=None, max_length=64)
    predicted_cached_tokens: int | None = Field(default=None, ge=0)
    engine_cached_tokens: int | None = Field(default=None, ge=0)
    ttft_ms: float | None = Field(default=None, ge=0)
    e2e_ms: float | None = Field(default=None, ge=0)
    status: int | None = Field(default=None, ge=100, le=599)
    predicted_ttft_ms: float | None = Field(default=None, ge=0)  # flow control's prediction


@dataclass(frozen=True, slots=True)
class TraceFile:
    """A parsed trace: its header (the default one when the file has none) and its records."""

    header: TraceHeader
    records: tuple[TraceRecord, ...]
    has_header: bool


def _error(source: str, line_no: int, err: ValidationError) -> ConfigError:
    first = err.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "line"
    return ConfigError(f"{source}:{line_no}: {field}: {first['msg']}")


def _load_json(source: str, line_no: int, line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{source}:{line_no}: not JSON: {err.msg}") from err
    except RecursionError as err:
        raise ConfigError(f"{source}:{line_no}: not a record: JSON nested too deeply") from err


def parse_trace(lines: Iterable[str], source: str = "trace") -> TraceFile:
    """Parse trace lines (blank lines skipped); a ConfigError names the line and the field."""
    header: TraceHeader | None = None
    records: list[TraceRecord] = []
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        data = _load_json(source, line_no, line)
        if not isinstance(data, dict):
            raise ConfigError(f"{source}:{line_no}: a record is a JSON object")
        try:
            if "warmfleet_trace" in data:
                if header is not None or records:
                    raise ConfigError(f"{source}:{line_no}: the header must be the first line")
                header = TraceHeader.model_validate(data)
            else:
                records.append(TraceRecord.model_validate(data))
        except ValidationError as err:
            raise _error(source, line_no, err) from err
    return TraceFile(header or TraceHeader(), tuple(records), header is not None)


def header_line(header: TraceHeader) -> str:
    """The header as one JSON line (no newline)."""
    return json.dumps(header.model_dump(exclude_none=True), separators=(",", ":"))


def record_line(record: TraceRecord | Mapping[str, Any]) -> str:
    """One record as one compact JSON line (no newline); unset optional fields left out."""
    if not isinstance(record, TraceRecord):
        record = TraceRecord.model_validate(record)
    return json.dumps(record.model_dump(exclude_none=True), separators=(",", ":"))
