"""Metrics of one simulated run, and the strategy-independent reuse bounds of a request stream."""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import takewhile

from warmfleet.core.types import RoutingKey
from warmfleet.sim.records import RequestRecord, SimResult

PERCENTILES = (50, 90, 95, 99)


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def percentiles_ms(values_s: Sequence[float]) -> dict[str, float]:
    return {f"p{p}": percentile(values_s, p) * 1000.0 for p in PERCENTILES}


def ideal_hit_tokens(
    keys: Sequence[RoutingKey],
    order: Sequence[int],
    block_tokens: int,
    output_blocks: Sequence[tuple[int, ...]] = (),
) -> int:
    """Token-weighted hits of one infinite cache fed the stream (leading full blocks only);
    a request's ``output_blocks`` enter the cache after it, like the engine's."""
    seen: set[int] = set()
    hits = 0
    for index in order:
        hashes = keys[index].block_hashes
        hits += sum(1 for _ in takewhile(seen.__contains__, hashes)) * block_tokens
        seen.update(hashes)
        if output_blocks:
            seen.update(output_blocks[index])
    return hits


def lru_hit_tokens(
    keys: Sequence[RoutingKey],
    order: Sequence[int],
    block_tokens: int,
    capacity_blocks: int,
    output_blocks: Sequence[tuple[int, ...]] = (),
) -> int:
    """Token-weighted hits of ONE LRU block cache of ``capacity_blocks`` fed the stream.

    A request's blocks are touched deepest first, so its root ends most recently used (the
    engine's eviction order). This is the fleet ceiling when the capacity is the whole fleet's.
    """
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for index in order:
        hashes = keys[index].block_hashes
        hits += sum(1 for _ in takewhile(cache.__contains__, hashes)) * block_tokens
        chain = hashes + output_blocks[index] if output_blocks else hashes
        for h in reversed(chain):
            if h in cache:
                cache.move_to_end(h)
            else:
                cache[h] = None
        while len(cache) > capacity_blocks:
            cache.popitem(last=False)
    return hits


@dataclass(slots=True)
class RunMetrics:
    """Everything reported for one strategy (``as_report`` gives the JSON form)."""

    ttft_s: list[float]
    e2e_s: list[float]
    completed: int
    rejected: int
    submitted: int
    throughput_rps: float
    output_tokens_per_s: float
    hit_rate: float
    reuse: dict[str, float]
    share_pct: dict[str, float]
    spills: int
    decisions_by_reason: dict[str, int]
    moved_fraction: list[float] = field(default_factory=list)
    timeline: list[tuple[float, float]] = field(default_factory=list)  # (t_s, hit rate)
    tenants: dict[str, dict[str, object]] = field(default_factory=dict)  # sim.tenants
    cached_tokens: list[int] = field(default_factory=list)  # per request, in request order
    instances: list[str] = field(default_factory=list)  # serving instance, in request order
    shed: int = 0  # of ``rejected``: answered by flow control without being served
    shed_by_reason: dict[str, int] = field(default_factory=dict)  # ``shed`` / ``deadline``

    def as_report(self) -> dict[str, object]:
        shares = list(self.share_pct.values()) or [0.0]
        requests = {
            "submitted": self.submitted,
            "completed": self.completed,
            "rejected": self.rejected,
        }
        if self.shed:
            requests["shed"] = self.shed
            requests.update({f"shed_{k}": v for k, v in self.shed_by_reason.items()})
        report: dict[str, object] = {
            "ttft_ms": percentiles_ms(self.ttft_s),
            "e2e_ms": percentiles_ms(self.e2e_s),
            "throughput_rps": self.throughput_rps,
            "output_tokens_per_s": self.output_tokens_per_s,
            "hit_rate": self.hit_rate,
            "reuse": dict(self.reuse),
            "share": {"min": min(shares), "max": max(shares), "per_instance": dict(self.share_pct)},
            "spills": self.spills,
            "moved_fraction": list(self.moved_fraction),
            "decisions_by_reason": dict(self.decisions_by_reason),
            "requests": requests,
        }
        if self.tenants:
            report["tenants"] = self.tenants
        return report


def _timeline(done: Sequence[RequestRecord], buckets: int) -> list[tuple[float, float]]:
    if not done:
        return []
    end_s = max(r.first_token_s for r in done)
    width_s = max(end_s / buckets, 1e-9)
    prompt = [0] * buckets
    cached = [0] * buckets
    for r in done:
        slot = min(int(r.first_token_s / width_s), buckets - 1)
        prompt[slot] += r.prompt_tokens
        cached[slot] += r.cached_tokens
    return [
        ((slot + 0.5) * width_s, cached[slot] / prompt[slot])
        for slot in range(buckets)
        if prompt[slot]
    ]


def compute_metrics(
    result: SimResult,
    keys: Sequence[RoutingKey],
    block_tokens: int,
    fleet_capacity_blocks: int,
    timeline_buckets: int = 60,
) -> RunMetrics:
    records = result.records
    done = [r for r in records if r.done and not r.rejected]
    routed = [r for r in records if r.instance_id]
    prompt_total = sum(r.prompt_tokens for r in done) or 1
    start_s = min((r.arrival_s for r in routed), default=0.0)
    end_s = max((r.finish_s for r in done), default=start_s)
    span_s = max(end_s - start_s, 1e-9)
    order = sorted(range(len(records)), key=lambda i: (records[i].arrival_s, i))
    order = [i for i in order if records[i].done and not records[i].rejected]
    counts = Counter(r.instance_id for r in routed)
    routed_total = len(routed) or 1
    hit_rate = sum(r.cached_tokens for r in done) / prompt_total
    return RunMetrics(
        ttft_s=[r.first_token_s - r.arrival_s for r in done],
        e2e_s=[r.finish_s - r.arrival_s for r in done],
        completed=len(done),
        rejected=sum(1 for r in records if r.rejected),
        submitted=len(records),
        throughput_rps=len(done) / span_s,
        output_tokens_per_s=sum(r.output_tokens for r in done) / span_s,
        hit_rate=hit_rate,
        reuse={
            "available": sum(r.available_tokens for r in done) / prompt_total,
            "captured": sum(r.captured_tokens for r in done) / prompt_total,
            "delivered": hit_rate,
            "ideal": ideal_hit_tokens(keys, order, block_tokens, result.output_block_hashes)
            / prompt_total,
            "fleet_ceiling": lru_hit_tokens(
                keys, order, block_tokens, fleet_capacity_blocks, result.output_block_hashes
            )
            / prompt_total,
        },
        share_pct={i: 100.0 * counts.get(i, 0) / routed_total for i in result.instance_ids},
        spills=sum(1 for r in routed if r.spilled),
        decisions_by_reason=dict(sorted(Counter(r.reason for r in routed).items())),
        timeline=_timeline(done, timeline_buckets),
        cached_tokens=[r.cached_tokens if r.done and not r.rejected else 0 for r in records],
        instances=[r.instance_id if r.done and not r.rejected else "" for r in records],
        shed=sum(1 for r in records if r.shed_status),
        shed_by_reason=dict(sorted(Counter(r.reason for r in records if r.shed_status).items())),
    )
