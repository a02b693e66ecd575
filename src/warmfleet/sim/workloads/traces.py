"""Trace-driven workloads: Mooncake JSONL, Azure LLM CSV, LMBenchmark ShareGPT text replay.

Paths are arguments; ``default_trace_path`` finds ``../shared/traces/...`` next to the repository.
"""

from __future__ import annotations

import bisect
import csv
import itertools
import json
import random
import statistics
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import Field

from warmfleet.core.config import StrictModel
from warmfleet.core.errors import ConfigError
from warmfleet.core.hashing import hash_str
from warmfleet.sim.workloads.base import Segment, WorkloadRequest

MOONCAKE_BLOCK_TOKENS = 512

DEFAULT_TRACES = {
    "mooncake": "mooncake_conversation_first30min.jsonl",
    "azure": "azure_llm_2023_conv.csv",
    "aws-short-context": "text/lmbenchmark_sharegpt_run.json",
}


def repo_root() -> Path:
    """The source checkout this package runs from (editable install)."""
    return Path(__file__).resolve().parents[4]


def default_trace_path(scenario: str) -> Path | None:
    """``../shared/traces/<file>`` relative to the repository root, if it exists."""
    name = DEFAULT_TRACES.get(scenario)
    if name is None:
        return None
    for base in (repo_root(), Path.cwd()):
        candidate = base.parent / "shared" / "traces" / name
        if candidate.exists():
            return candidate
    return None


def _open_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"trace: cannot read {path}: {err}") from err


class MooncakeConfig(StrictModel):
    type: Literal["mooncake"] = "mooncake"
    trace: str | None = None
    spread_buckets: bool = True


def _spread(timestamps_ms: list[int], rng: random.Random) -> list[float]:
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


def mooncake(path: Path, seed: int, spread_buckets: bool = True) -> tuple[WorkloadRequest, ...]:
    """Each ``hash_ids`` entry is one 512-token block; the last block is partial."""
    rows = []
    for line_no, line in enumerate(_open_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ConfigError(f"trace: {path}:{line_no}: not JSON: {err}") from err
    stamps = [int(r["timestamp"]) for r in rows]
    arrivals = _spread(stamps, random.Random(seed)) if spread_buckets else [t / 1e3 for t in stamps]
    out = []
    for index, (row, arrival_s) in enumerate(zip(rows, arrivals, strict=True)):
        ids = [int(h) for h in row["hash_ids"]]
        input_tokens = int(row["input_length"])
        segments = [Segment(h, MOONCAKE_BLOCK_TOKENS) for h in ids[:-1]]
        last = input_tokens - MOONCAKE_BLOCK_TOKENS * (len(ids) - 1)
        if ids and last > 0:
            segments.append(Segment(ids[-1], last))
        out.append(WorkloadRequest(index, arrival_s, tuple(segments), int(row["output_length"])))
    return tuple(sorted(out, key=lambda r: (r.arrival_s, r.request_id)))


class AzureConfig(StrictModel):
    """Arrivals and lengths from an Azure LLM inference CSV (no prefix data: prompts unique)."""

    type: Literal["azure"] = "azure"
    trace: str | None = None


def _parse_azure_time(text: str) -> float:
    whole, _, frac = text.strip().partition(".")
    stamp = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").timestamp()
    return stamp + (float("0." + frac) if frac else 0.0)


def azure(path: Path, seed: int) -> tuple[WorkloadRequest, ...]:
    reader = csv.DictReader(_open_text(path).splitlines())
    rows = list(reader)
    if not rows:
        return ()
    start_s = _parse_azure_time(rows[0]["TIMESTAMP"])
    out = []
    for index, row in enumerate(rows):
        arrival_s = _parse_azure_time(row["TIMESTAMP"]) - start_s
        prompt = max(1, int(row["ContextTokens"]))
        segment = Segment(hash_str(f"azure:{index}", seed), prompt)
        out.append(
            WorkloadRequest(index, arrival_s, (segment,), max(1, int(row["GeneratedTokens"])))
        )
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


def sharegpt_replay(
    path: Path, config: ShareGptReplayConfig, seed: int
) -> tuple[WorkloadRequest, ...]:
    try:
        items = json.loads(_open_text(path))
    except json.JSONDecodeError as err:
        raise ConfigError(f"trace: {path}: not JSON: {err}") from err
    sessions: dict[str, int] = {}
    out = []
    for index, item in enumerate(items):
        text = str(item["input"])
        session = sessions.setdefault(text[: config.session_prefix_chars], len(sessions))
        segments = text_segments(text, config.chars_per_token, config.chunk_tokens, seed)
        output = max(1, int(str(item["output_length"])))
        out.append(WorkloadRequest(index, 0.0, segments, output, session_id=session))
    return tuple(out)
