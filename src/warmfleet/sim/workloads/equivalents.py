"""Synthetic equivalents of the trace-driven workloads, run when their trace file is absent.

The real traces stay outside the package (``../shared/traces``); a fresh install has none. Each
trace-driven built-in (``mooncake``, ``azure``, ``aws-short-context``) then runs a seeded
generator whose statistics were measured on its real trace: the same request count, the arrival
rate per 5-minute window (and, for Azure, the gaps' burstiness), the length distributions
(nearest-rank quantiles, drawn by linear interpolation between them), and for Mooncake the
prefix structure (which earlier prompt a request continues, how much of it it keeps, how many
blocks it adds). The figures come from
``scripts/traces/measure_equivalents.py``; ``tests/sim/test_sim_equivalents.py`` compares each
generator with its real trace when the file is present. A real trace always wins when found; the
report says which one ran. Pure: no file is read here.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Sequence

from warmfleet.core.hashing import hash_str
from warmfleet.sim.workloads.base import Segment, WorkloadRequest
from warmfleet.sim.workloads.traces import (
    MOONCAKE_BLOCK_TOKENS,
    MooncakeRow,
    ShareGptReplayConfig,
    azure_requests,
    mooncake_requests,
)

# (cumulative probability, value) pairs, nearest-rank quantiles of the real trace
Quantiles = tuple[tuple[float, float], ...]

RATE_WINDOW_S = 300.0  # the arrival rates below are per 5-minute window of the real trace


# ---- mooncake: kvcache-ai/Mooncake FAST25-release conversation_trace.jsonl, first 30 min -------
# (../shared/traces/mooncake_conversation_first30min.jsonl, Apache-2.0), measured over its 5,719
# rows. A "follow-up" continues an earlier prompt past the shared block 0 (its leading hash ids
# match >= 2 blocks of one earlier row, the "parent": the last row holding the deepest match).
MOONCAKE_REQUESTS = 5719
MOONCAKE_RATES_RPS = (3.06, 2.773, 3.26, 3.1, 3.357, 3.549)  # per window; Poisson within one
MOONCAKE_BUCKET_MS = 3000  # the trace's timestamps come in ~3 s buckets
MOONCAKE_FOLLOW_UP_SHARE = 0.3548
MOONCAKE_FRESH_INPUT_TOKENS: Quantiles = (
    (0.0, 891), (0.05, 897), (0.1, 906), (0.2, 1153), (0.3, 2021), (0.4, 4347), (0.5, 5947),
    (0.6, 8445), (0.7, 11869), (0.8, 16913), (0.9, 27154), (0.95, 41478), (0.99, 93901),
    (1.0, 122889),
)  # fmt: skip
MOONCAKE_OUTPUT_TOKENS: Quantiles = (
    (0.0, 1), (0.05, 9), (0.1, 24), (0.2, 96), (0.3, 215), (0.4, 298), (0.5, 356), (0.6, 402),
    (0.7, 452), (0.8, 511), (0.9, 609), (0.95, 708), (0.99, 1105), (1.0, 2000),
)  # fmt: skip
MOONCAKE_PARENT_GAP_S: Quantiles = (
    (0.0, 3.0), (0.05, 30.0), (0.1, 42.0), (0.2, 60.0), (0.3, 75.0), (0.4, 96.0), (0.5, 120.0),
    (0.6, 156.0), (0.7, 210.0), (0.8, 300.0), (0.9, 435.0), (0.95, 561.0), (0.99, 930.0),
    (1.0, 1533.0),
)  # fmt: skip
MOONCAKE_KEPT_FRACTION: Quantiles = (  # of the parent's blocks
    (0.0, 0.015), (0.05, 0.13), (0.1, 0.357), (0.2, 0.667), (0.3, 0.833), (0.4, 0.889),
    (0.5, 0.923), (0.6, 0.941), (0.7, 0.957), (0.8, 0.972), (0.9, 0.982), (0.95, 0.99),
    (0.99, 1.0), (1.0, 1.0),
)  # fmt: skip
MOONCAKE_ADDED_BLOCKS: Quantiles = (
    (0.0, 0), (0.05, 1), (0.1, 1), (0.2, 1), (0.3, 2), (0.4, 2), (0.5, 2), (0.6, 3), (0.7, 4),
    (0.8, 11), (0.9, 21), (0.95, 31), (0.99, 57), (1.0, 186),
)  # fmt: skip

# ---- azure: Azure/AzurePublicDataset AzureLLMInferenceTrace_conv.csv (CC-BY 4.0) ----------------
# (../shared/traces/azure_llm_2023_conv.csv), measured over its 19,366 rows (3,502 s). Its rate
# moves within minutes (191 to 507 requests a minute); its gaps' coefficient of variation is
# 1.094 over the whole trace. Gamma gaps of CV 1.07 within the windows give that overall (the
# rate changes add the rest; tests/sim/test_sim_equivalents.py compares).
AZURE_REQUESTS = 19366
AZURE_RATES_RPS = (
    4.817, 4.74, 5.19, 5.203, 6.28, 7.463, 7.43, 6.13, 5.67, 4.747, 4.323, 3.807,
)  # fmt: skip
AZURE_GAP_CV = 1.07
AZURE_INPUT_TOKENS: Quantiles = (
    (0.0, 2), (0.05, 181), (0.1, 207), (0.2, 387), (0.3, 403), (0.4, 703), (0.5, 1020),
    (0.6, 1071), (0.7, 1130), (0.8, 1315), (0.9, 2735), (0.95, 4083), (0.99, 4142), (1.0, 14050),
)  # fmt: skip
AZURE_OUTPUT_TOKENS: Quantiles = (
    (0.0, 7), (0.05, 41), (0.1, 54), (0.2, 77), (0.3, 91), (0.4, 103), (0.5, 129), (0.6, 177),
    (0.7, 384), (0.8, 400), (0.9, 424), (0.95, 451), (0.99, 601), (1.0, 1000),
)  # fmt: skip

# ---- aws-short-context: LMCache/LMBenchmark sharegpt/run.json (Apache-2.0) ----------------------
# (../shared/traces/text/lmbenchmark_sharegpt_run.json), measured over its 252 requests: 55
# conversations (same first 256 characters), asked round by round (every conversation's next
# turn, in conversation order); each turn's text is the previous turn's plus the growth.
SHAREGPT_TURNS_PER_SESSION = ((3, 16), (4, 17), (5, 8), (6, 9), (7, 2), (9, 2), (10, 1))
SHAREGPT_FIRST_PROMPT_CHARS: Quantiles = (
    (0.0, 669), (0.05, 1011), (0.1, 1407), (0.2, 1890), (0.3, 2305), (0.4, 2701), (0.5, 3075),
    (0.6, 3426), (0.7, 3690), (0.8, 4231), (0.9, 5017), (0.95, 5635), (0.99, 6358), (1.0, 6358),
)  # fmt: skip
SHAREGPT_GROWTH_CHARS: Quantiles = (
    (0.0, 60), (0.05, 183), (0.1, 404), (0.2, 537), (0.3, 716), (0.4, 865), (0.5, 1062),
    (0.6, 1195), (0.7, 1343), (0.8, 1576), (0.9, 1871), (0.95, 2103), (0.99, 2461), (1.0, 2512),
)  # fmt: skip
SHAREGPT_OUTPUT_TOKENS: Quantiles = (
    (0.0, 1), (0.05, 20), (0.1, 61), (0.2, 110), (0.3, 138), (0.4, 184), (0.5, 225), (0.6, 250),
    (0.7, 276), (0.8, 321), (0.9, 391), (0.95, 448), (0.99, 574), (1.0, 690),
)  # fmt: skip


def draw(table: Quantiles, rng: random.Random) -> float:
    """A value of the distribution ``table`` describes (linear between its quantiles)."""
    u = rng.random()
    for (p0, v0), (p1, v1) in itertools.pairwise(table):
        if u <= p1:
            return v0 if p1 == p0 else v0 + (v1 - v0) * (u - p0) / (p1 - p0)
    return table[-1][1]


def windowed_arrivals(
    rates_rps: Sequence[float],
    window_s: float,
    count: int,
    rng: random.Random,
    gap_cv: float = 1.0,
) -> list[float]:
    """``count`` arrival times (s) whose rate is ``rates_rps[k]`` in the k-th window of
    ``window_s`` seconds (the last rate holds after the last window); gaps exponential
    (Poisson) for ``gap_cv`` 1, else gamma with that coefficient of variation."""
    shape = 1.0 / (gap_cv * gap_cv)
    out = []
    now_s = 0.0
    for _ in range(count):
        rate = rates_rps[min(int(now_s // window_s), len(rates_rps) - 1)]
        if gap_cv == 1.0:
            now_s += rng.expovariate(rate)
        else:
            now_s += rng.gammavariate(shape, 1.0 / (rate * shape))
        out.append(now_s)
    return out


def _follow_up(
    parent_ids: Sequence[int], rng: random.Random, next_id: int
) -> tuple[tuple[int, ...], int]:
    kept = min(len(parent_ids), max(2, round(draw(MOONCAKE_KEPT_FRACTION, rng) * len(parent_ids))))
    added = round(draw(MOONCAKE_ADDED_BLOCKS, rng))
    return (*parent_ids[:kept], *range(next_id, next_id + added)), next_id + added


def mooncake_equivalent_rows(seed: int, count: int = MOONCAKE_REQUESTS) -> list[MooncakeRow]:
    """Mooncake rows (timestamp ms in 3 s buckets, hash ids, input, output tokens) with the
    conversation trace's rates, lengths and prefix structure. Every prompt starts with block 0
    (the shared system prompt); a follow-up keeps a fraction of an earlier prompt's blocks,
    chosen by the time since it, and adds new blocks."""
    rng = random.Random(hash_str("mooncake-equivalent", seed))
    arrivals_s = windowed_arrivals(MOONCAKE_RATES_RPS, RATE_WINDOW_S, count, rng)
    rows: list[MooncakeRow] = []
    next_id = 1
    for index, arrival_s in enumerate(arrivals_s):
        ids: tuple[int, ...] = ()
        if index and rng.random() < MOONCAKE_FOLLOW_UP_SHARE:
            target_s = arrival_s - draw(MOONCAKE_PARENT_GAP_S, rng)
            parent = min(max(bisect.bisect_right(arrivals_s, target_s, 0, index) - 1, 0), index - 1)
            if len(rows[parent][1]) >= 2:
                ids, next_id = _follow_up(rows[parent][1], rng, next_id)
        if ids:
            input_tokens = (len(ids) - 1) * MOONCAKE_BLOCK_TOKENS + rng.randint(
                1, MOONCAKE_BLOCK_TOKENS
            )
        else:
            input_tokens = max(1, round(draw(MOONCAKE_FRESH_INPUT_TOKENS, rng)))
            blocks = math.ceil(input_tokens / MOONCAKE_BLOCK_TOKENS)
            ids = (0, *range(next_id, next_id + blocks - 1))
            next_id += blocks - 1
        stamp_ms = int(arrival_s * 1000) // MOONCAKE_BUCKET_MS * MOONCAKE_BUCKET_MS
        output = max(1, round(draw(MOONCAKE_OUTPUT_TOKENS, rng)))
        rows.append((stamp_ms, ids, input_tokens, output))
    return rows


def mooncake_equivalent(seed: int, spread_buckets: bool = True) -> tuple[WorkloadRequest, ...]:
    return mooncake_requests(mooncake_equivalent_rows(seed), seed, spread_buckets)


def azure_equivalent(seed: int, count: int = AZURE_REQUESTS) -> tuple[WorkloadRequest, ...]:
    """The Azure conversation trace's rates and lengths; every prompt unique (as there)."""
    rng = random.Random(hash_str("azure-equivalent", seed))
    rows = [
        (
            arrival_s,
            max(1, round(draw(AZURE_INPUT_TOKENS, rng))),
            max(1, round(draw(AZURE_OUTPUT_TOKENS, rng))),
        )
        for arrival_s in windowed_arrivals(AZURE_RATES_RPS, RATE_WINDOW_S, count, rng, AZURE_GAP_CV)
    ]
    return azure_requests(rows, seed)


def _session_turns(rng: random.Random) -> list[int]:
    """Turns of each conversation: the measured counts, shuffled."""
    turns = [n for n, sessions in SHAREGPT_TURNS_PER_SESSION for _ in range(sessions)]
    rng.shuffle(turns)
    return turns


def _chunks(session: int, chars: int, config: ShareGptReplayConfig, seed: int) -> list[Segment]:
    """A conversation's first ``chars`` characters as the replay cuts text: chunks of
    ``chars_per_token * chunk_tokens`` characters, equal for equal (conversation, position)."""
    chunk_chars = max(1, round(config.chars_per_token * config.chunk_tokens))
    out = []
    for start in range(0, chars, chunk_chars):
        length = min(chunk_chars, chars - start)
        content = hash_str(f"sharegpt-equivalent:{session}:{start}:{length}", seed)
        out.append(Segment(content, max(1, round(length / config.chars_per_token))))
    return out


def sharegpt_equivalent(config: ShareGptReplayConfig, seed: int) -> tuple[WorkloadRequest, ...]:
    """LMBenchmark's ShareGPT run: conversations asked round by round, each turn's prompt the
    whole history so far (the previous prompt plus the answer and the next question)."""
    rng = random.Random(hash_str("sharegpt-equivalent", seed))
    turns = _session_turns(rng)
    chars = [round(draw(SHAREGPT_FIRST_PROMPT_CHARS, rng)) for _ in turns]
    out: list[WorkloadRequest] = []
    for round_ in range(max(turns)):
        for session, session_turns in enumerate(turns):
            if round_ >= session_turns:
                continue
            if round_:
                chars[session] += round(draw(SHAREGPT_GROWTH_CHARS, rng))
            segments = tuple(_chunks(session, chars[session], config, seed))
            output = max(1, round(draw(SHAREGPT_OUTPUT_TOKENS, rng)))
            out.append(WorkloadRequest(len(out), 0.0, segments, output, session_id=session))
    return tuple(out)
