"""Trace-driven workloads: Mooncake JSONL, Azure LLM CSV, LMBenchmark ShareGPT text replay.

Each parser takes a ``Trace``: the file's text as the CLI edge read it and the name it came
from (for errors). The edge finds the file (``--trace``, or the workload's ``DEFAULT_TRACES``
file in the traces directory, ``warmfleet.edge.resolve_traces_dir``); nothing here opens a file
or guesses a location.
"""

from __future__ import annotations

import bisect
import csv
import itertools
import json
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from pydantic import Field

from warmfleet.api import trace_format
from warmfleet.api.trace_format import TraceFile, parse_trace
from warmfleet.core.config import StrictModel
from warmfleet.core.errors import ConfigError
from warmfleet.core.hashing import hash_str
from warmfleet.sim.workloads.base import Segment, WorkloadRequest

MOONCAKE_BLOCK_TOKENS = trace_format.MOONCAKE_BLOCK_TOKENS  # the format's default block size

# each trace-driven workload's file, relative to a traces directory
DEFAULT_TRACES = {
    "mooncake": "mooncake_conversation_first30min.jsonl",
    "azure": "azure_llm_2023_conv.csv",
    "aws-short-context": "text/lmbenchmark_sharegpt_run.json",
}


@dataclass(frozen=True, slots=True)
class Trace:
    """A trace file's ``text`` as the edge read it; ``source`` (its path) names it in errors."""

    text: str
    source: str


class MooncakeConfig(StrictModel):
    type: Literal["mooncake"] = "mooncake"
    trace: str | None = None
    spread_buckets: bool = True


def _spread(timestamps_ms: list[float], rng: random.Random) -> list[float]:
    """Spread each ~3 s timestamp bucket uniformly up to the next distinct timestamp."""
    distinct = sorted(set(timestamps_ms))
    gaps = [b - a for a, b in itertools.pairwise(distinct)]
    last_gap = statistics.median(gaps) if gaps else 0.0
    out = []
    for ts in timestamps_ms:
        pos = bisect.bisect_right(distinct, ts)
        width = (distinct[pos] - ts) if pos < len(distinct) else last_gap
        out.append((ts + rng.uniform(0.0, width)) / 1000.0)
    return out


# (timestamp ms, hash ids, input tokens, output tokens): one line of a Mooncake trace
MooncakeRow = tuple[float, Sequence[int], int, int]


@dataclass(frozen=True, slots=True)
class RequestLabels:
    """Who sent a trace record (warmfleet's trace format): carried onto its WorkloadRequest."""

    tenant: str | None = None
    session_id: int | None = None
    priority: int | None = None
    deadline_ms: float | None = None


def _json_int(value: object, name: str) -> int:
    """A JSON integer (``int()`` would take ``true``, ``"12"`` and truncate ``12.7``)."""
    if type(value) is not int:
        raise TypeError(f"{name}: expected an integer, got {value!r}")
    return value


def _mooncake_row(source: str, line_no: int, line: str) -> MooncakeRow:
    """(timestamp ms, hash ids, input tokens, output tokens) of one JSONL line."""
    try:
        row = json.loads(line)
        if not isinstance(row, dict):
            raise TypeError("a line must be a JSON object")
        ids = [_json_int(h, "hash_ids") for h in row["hash_ids"]]
        out = (
            _json_int(row["timestamp"], "timestamp"),
            ids,
            _json_int(row["input_length"], "input_length"),
            _json_int(row["output_length"], "output_length"),
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError) as err:
        raise ConfigError(f"trace: {source}:{line_no}: not a Mooncake trace row: {err}") from err
    except RecursionError as err:
        raise ConfigError(f"trace: {source}:{line_no}: not a Mooncake trace row: nested") from err
    timestamp, _, input_tokens, output_tokens = out
    most = trace_format.MAX_TOKENS
    limits = (
        ("timestamp", timestamp, None),
        ("input_length", input_tokens, most),
        ("output_length", output_tokens, most),
    )
    for name, value, top in limits:
        if value < 0 or (top is not None and value > top):
            raise ConfigError(f"trace: {source}:{line_no}: {name}: {value} is out of range")
    return out


def _mooncake_segments(
    ids: Sequence[int], input_tokens: int, tail_id: int, block_tokens: int
) -> tuple[Segment, ...]:
    """One segment per ``hash_id`` block (the last one partial), ``input_tokens`` in all: ids
    past the prompt are dropped, a prompt longer than its ids ends with unique content."""
    segments = []
    left = input_tokens
    for h in ids:
        if left <= 0:
            break
        take = min(block_tokens, left)
        segments.append(Segment(h, take))
        left -= take
    if left > 0:
        segments.append(Segment(tail_id, left))
    return tuple(segments)


def mooncake(trace: Trace, seed: int, spread_buckets: bool = True) -> tuple[WorkloadRequest, ...]:
    """Each ``hash_ids`` entry is one 512-token block; the last block is partial."""
    rows = [
        _mooncake_row(trace.source, line_no, line)
        for line_no, line in enumerate(trace.text.splitlines(), 1)
        if line.strip()
    ]
    return mooncake_requests(rows, seed, spread_buckets)


def mooncake_requests(
    rows: Sequence[MooncakeRow],
    seed: int,
    spread_buckets: bool = True,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    labels: Sequence[RequestLabels] | None = None,
) -> tuple[WorkloadRequest, ...]:
    """Requests of Mooncake rows (timestamp ms, hash ids, input tokens, output tokens), read
    from a Mooncake trace, a warmfleet trace (``trace_file_requests``: ``block_tokens`` from its
    header, ``labels`` from its records) or generated (``equivalents.mooncake_equivalent``).
    ``request_id`` is the row's index; the requests come sorted by arrival."""
    stamps = [row[0] for row in rows]
    arrivals = _spread(stamps, random.Random(seed)) if spread_buckets else [t / 1e3 for t in stamps]
    no_labels = RequestLabels()
    out = []
    for index, ((_, ids, input_tokens, output), arrival_s) in enumerate(
        zip(rows, arrivals, strict=True)
    ):
        tail_id = hash_str(f"mooncake-tail:{index}", seed)
        segments = _mooncake_segments(ids, input_tokens, tail_id, block_tokens)
        label = labels[index] if labels is not None else no_labels
        out.append(
            WorkloadRequest(
                index,
                arrival_s,
                segments,
                output,
                session_id=label.session_id,
                tenant=label.tenant,
                priority=label.priority,
                deadline_ms=label.deadline_ms,
            )
        )
    return tuple(sorted(out, key=lambda r: (r.arrival_s, r.request_id)))


def parse_trace_text(trace: Trace) -> TraceFile:
    """A trace in warmfleet's format (docs/trace-format.md); errors name the line and field."""
    return parse_trace(trace.text.splitlines(), f"trace: {trace.source}")


def trace_file_requests(parsed: TraceFile, seed: int) -> tuple[WorkloadRequest, ...]:
    """The requests of a warmfleet trace, through the Mooncake conversion: ``hash_ids`` blocks
    of the header's ``block_tokens``, timestamps as arrivals (no bucket spreading), ``tenant``,
    ``priority`` and ``deadline_ms`` carried, each (tenant, session) one session (its turns
    sent in order)."""
    rows: list[MooncakeRow] = []
    labels: list[RequestLabels] = []
    sessions: dict[tuple[str | None, str], int] = {}
    for record in parsed.records:
        rows.append((record.timestamp, record.hash_ids, record.input_length, record.output_length))
        session = None
        if record.session is not None:
            key = (record.tenant, record.session)
            session = sessions.setdefault(key, len(sessions))
        labels.append(RequestLabels(record.tenant, session, record.priority, record.deadline_ms))
    return mooncake_requests(rows, seed, False, parsed.header.block_tokens, labels)


class AzureConfig(StrictModel):
    """Arrivals and lengths from an Azure LLM inference CSV (no prefix data: prompts unique)."""

    type: Literal["azure"] = "azure"
    trace: str | None = None


def _parse_azure_time(text: str) -> float:
    """Seconds since the epoch of ``2023-11-16 18:15:46.6805900`` (2023 traces: 7 fraction
    digits, no offset) or ``2024-05-10 00:00:00.009930+00:00`` (2024: an offset, the fraction
    sometimes absent). A stamp without an offset is UTC, never the machine's local time."""
    stamp = datetime.fromisoformat(text.strip())  # 3.11: digits past microseconds are cut
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def _azure_row(source: str, line_no: int, row: dict[str, str]) -> tuple[float, int, int]:
    """(arrival s, prompt tokens, output tokens) of one CSV row; a token count outside 0 to
    ``MAX_TOKENS`` is an error naming the line and the column (0 counts as 1 token)."""
    try:
        stamp = _parse_azure_time(row["TIMESTAMP"])
        prompt, output = int(row["ContextTokens"]), int(row["GeneratedTokens"])
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"trace: {source}:{line_no}: not an Azure LLM trace row: {err}") from err
    for name, value in (("ContextTokens", prompt), ("GeneratedTokens", output)):
        if not 0 <= value <= trace_format.MAX_TOKENS:
            raise ConfigError(
                f"trace: {source}:{line_no}: {name}: {value} is out of range "
                f"(0 to {trace_format.MAX_TOKENS})"
            )
    return stamp, max(1, prompt), max(1, output)


def azure(trace: Trace, seed: int) -> tuple[WorkloadRequest, ...]:
    reader = csv.DictReader(trace.text.splitlines())
    rows = [_azure_row(trace.source, line_no, row) for line_no, row in enumerate(reader, 2)]
    return azure_requests(rows, seed)


def azure_requests(
    rows: Sequence[tuple[float, int, int]], seed: int
) -> tuple[WorkloadRequest, ...]:
    """Requests of Azure rows (arrival s, prompt tokens, output tokens), read from a trace or
    generated (``equivalents.azure_equivalent``); every prompt is unique."""
    if not rows:
        return ()
    start_s = min(stamp for stamp, _, _ in rows)
    out = []
    for index, (stamp_s, prompt, output) in enumerate(rows):
        segment = Segment(hash_str(f"azure:{index}", seed), prompt)
        out.append(WorkloadRequest(index, stamp_s - start_s, (segment,), output))
    return tuple(sorted(out, key=lambda r: (r.arrival_s, r.request_id)))


class ShareGptReplayConfig(StrictModel):
    """AWS short-context: LMBenchmark ShareGPT multi-turn replay (each input = whole history).

    Text becomes segments of ``chunk_tokens`` tokens (``chars_per_token`` characters each) whose
    content ids chain, so equal text prefixes share content ids. Turns of one conversation (same
    first ``session_prefix_chars`` characters) form a session.
    """

    type: Literal["aws-short-context"] = "aws-short-context"
    trace: str | None = None
    chars_per_token: float = Field(4.0, gt=0.0)
    chunk_tokens: int = Field(16, ge=1)
    session_prefix_chars: int = Field(256, ge=1)


def text_segments(
    text: str, chars_per_token: float, chunk_tokens: int, seed: int
) -> tuple[Segment, ...]:
    """Chained chunks: equal text prefixes give equal segment prefixes."""
    chunk_chars = max(1, round(chars_per_token * chunk_tokens))
    out = []
    prev = seed
    for start in range(0, len(text), chunk_chars):
        chunk = text[start : start + chunk_chars]
        prev = hash_str(chunk, prev)
        out.append(Segment(prev, max(1, round(len(chunk) / chars_per_token))))
    return tuple(out)


def _sharegpt_item(source: str, index: int, item: object) -> tuple[str, int]:
    """(input text, output tokens) of one item: ``{"input": "...", "output_length": N}``, N an
    integer from 0 to ``MAX_TOKENS`` (0 counts as 1 token); otherwise a ConfigError naming it."""
    where = f"trace: {source}: item {index}"
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: not an object with input and output_length")
    missing = [key for key in ("input", "output_length") if key not in item]
    if missing:
        raise ConfigError(f"{where}: no {' or '.join(missing)}")
    text, output = item["input"], item["output_length"]
    if not isinstance(text, str):
        raise ConfigError(f"{where}: input: not a string: {type(text).__name__}")
    if type(output) is not int:
        raise ConfigError(f"{where}: output_length: not an integer: {output!r:.40}")
    if not 0 <= output <= trace_format.MAX_TOKENS:
        raise ConfigError(f"{where}: output_length: {output} is out of range")
    return text, max(1, output)


def sharegpt_replay(
    trace: Trace, config: ShareGptReplayConfig, seed: int
) -> tuple[WorkloadRequest, ...]:
    """The requests of an LMBenchmark ShareGPT run: a JSON list of ``{"input", "output_length"}``
    items (a malformed one is a ConfigError naming its index)."""
    try:
        items = json.loads(trace.text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"trace: {trace.source}: not JSON: {err}") from err
    except RecursionError as err:
        raise ConfigError(f"trace: {trace.source}: not JSON: nested too deeply") from err
    if not isinstance(items, list):
        raise ConfigError(f"trace: {trace.source}: not a JSON list of items")
    sessions: dict[str, int] = {}
    out = []
    for index, item in enumerate(items):
        text, output = _sharegpt_item(trace.source, index, item)
        session = sessions.setdefault(text[: config.session_prefix_chars], len(sessions))
        segments = text_segments(text, config.chars_per_token, config.chunk_tokens, seed)
        out.append(WorkloadRequest(index, 0.0, segments, output, session_id=session))
    return tuple(out)
