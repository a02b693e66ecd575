"""Engine metrics (Prometheus text) scraped before and after a run, and the run's summary.

The summary has the field names of ``warmfleet sim --json`` (``RunMetrics.as_report``) plus the
live-only fields (``itl_ms``, ``errors``, ``hit_rate_source``, ``share_source``, ...).
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import aiohttp

from warmfleet.bench.loadgen import LoadResult, LoadSpec, RequestResult, run_load
from warmfleet.core.types import Reason
from warmfleet.sim.metrics import percentiles_ms
from warmfleet.sim.workloads.base import WorkloadRequest

HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
# Engine request counters, first present wins (vLLM: request_success_total{finished_reason}).
REQUEST_COUNTERS = ("vllm:request_success_total", "vllm:num_requests_total")
SCRAPE_TIMEOUT_S = 5.0
# Reasons of decisions that always spill off the preferred instance (the simulator's ``spills``
# counts ``Decision.spilled``). prefix_hash's ``load_balance`` when every instance is at the
# threshold spills too, but the header cannot tell it from least_outstanding_requests'.
SPILL_REASONS = (Reason.OVERFLOW.value, Reason.REPLICATE.value)


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum of each metric's samples over all label sets (``# `` lines and bad lines skipped)."""
    out: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, _, rest = line.partition("{")
            _, sep, tail = rest.rpartition("}")
            if not sep:
                continue
        else:
            name, _, tail = line.partition(" ")
        fields = tail.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        name = name.strip()
        out[name] = out.get(name, 0.0) + value
    return out


@dataclass(frozen=True, slots=True)
class MetricsTarget:
    """One engine's metrics endpoint; ``instance`` names it in shares."""

    instance: str
    url: str

    @staticmethod
    def parse(text: str) -> MetricsTarget:
        """``ID=URL`` or a bare URL (then the URL is the id)."""
        ident, sep, url = text.partition("=")
        if sep and "://" not in ident:
            return MetricsTarget(ident, url)
        return MetricsTarget(text, text)


async def scrape(targets: Sequence[MetricsTarget]) -> dict[str, dict[str, float]]:
    """Every target's metrics; a failing target maps to an empty dict (never raises)."""
    timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(target: MetricsTarget) -> tuple[str, dict[str, float]]:
            try:
                async with session.get(target.url) as resp:
                    if resp.status != 200:
                        return target.instance, {}
                    return target.instance, parse_prometheus(await resp.text())
            except (aiohttp.ClientError, TimeoutError, OSError, UnicodeDecodeError):
                return target.instance, {}

        pairs = await asyncio.gather(*(one(t) for t in targets))
    return dict(pairs)


@dataclass(frozen=True, slots=True)
class EngineDelta:
    """Counter increases over a run, per instance."""

    hits: dict[str, float]
    queries: dict[str, float]
    requests: dict[str, float]
    # instances with a failed scrape (before or after): their counts are unknown, not zero
    missing: tuple[str, ...] = ()

    @property
    def hit_rate(self) -> float | None:
        queries = sum(self.queries.values())
        return sum(self.hits.values()) / queries if queries > 0 else None


def _delta(before: Mapping[str, float], after: Mapping[str, float], name: str) -> float | None:
    """The counter's increase; a counter that went down was reset (the instance restarted
    during the run): it counts from zero, as Prometheus' ``increase`` does."""
    if name not in after:
        return None
    now, then = after[name], before.get(name, 0.0)
    return now - then if now >= then else now


def engine_delta(
    before: Mapping[str, Mapping[str, float]], after: Mapping[str, Mapping[str, float]]
) -> EngineDelta:
    hits: dict[str, float] = {}
    queries: dict[str, float] = {}
    requests: dict[str, float] = {}
    missing = sorted({*before, *after} - {i for i in after if after[i] and before.get(i)})
    for instance, now in after.items():
        then = before.get(instance, {})
        if not then:  # the first scrape failed: its baseline is unknown, not zero
            continue
        hit = _delta(then, now, HITS)
        query = _delta(then, now, QUERIES)
        if hit is not None and query is not None:
            hits[instance], queries[instance] = hit, query
        for name in REQUEST_COUNTERS:
            count = _delta(then, now, name)
            if count is not None:
                requests[instance] = count
                break
    return EngineDelta(hits, queries, requests, tuple(missing))


def _shares(counts: Mapping[str, float], instances: Iterable[str]) -> dict[str, float]:
    names = list(dict.fromkeys([*instances, *counts]))
    total = sum(counts.values()) or 1.0
    return {name: 100.0 * counts.get(name, 0.0) / total for name in sorted(names)}


def summarize(
    load: LoadResult,
    engine: EngineDelta | None = None,
    instances: Sequence[str] = (),
    reuse_bounds: Mapping[str, float] | None = None,
) -> dict[str, object]:
    """The run in ``RunMetrics.as_report`` shape (shares in percent, like the simulator)."""
    ok = [r for r in load.results if r.ok]
    starts = [r.start_s for r in load.results]
    ends = [r.start_s + r.e2e_s for r in ok]
    span_s = max((max(ends) - min(starts)) if ends else 0.0, 1e-9)
    header_counts = Counter(r.instance for r in load.results if r.instance is not None)
    if header_counts:
        share_counts: Mapping[str, float] = {k: float(v) for k, v in header_counts.items()}
        share_source = "client_round_robin" if load.client_balanced else "response_headers"
    elif engine is not None and engine.requests:
        share_counts, share_source = engine.requests, "engine_metrics"
    else:
        share_counts, share_source = {}, "unknown"
    share_pct = _shares(share_counts, instances if share_counts else ())
    shares = list(share_pct.values()) or [0.0]
    hit_rate, hit_source = _hit_rate(ok, engine)
    reasons = Counter(r.reason for r in load.results if r.reason is not None)
    reuse = {"delivered": hit_rate, **(reuse_bounds or {})}
    return {
        "ttft_ms": percentiles_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "e2e_ms": percentiles_ms([r.e2e_s for r in ok]),
        "itl_ms": percentiles_ms([gap for r in ok for gap in r.itl_s]),
        "throughput_rps": len(ok) / span_s,
        "output_tokens_per_s": sum(r.output_tokens for r in ok) / span_s,
        "hit_rate": hit_rate,
        "hit_rate_source": hit_source,
        "reuse": reuse,
        "share": {"min": min(shares), "max": max(shares), "per_instance": share_pct},
        "share_source": share_source,
        "spills": sum(reasons.get(reason, 0) for reason in SPILL_REASONS),
        "moved_fraction": [],
        "decisions_by_reason": dict(sorted(reasons.items())),
        "requests": {
            "submitted": load.submitted,
            "completed": len(ok),
            "rejected": len(load.results) - len(ok),
            "not_sent": load.not_sent,
        },
        "errors": dict(sorted(Counter(r.error for r in load.results if r.error).items())),
        "error_samples": _error_samples(load.results),
        "wall_s": load.wall_s,
    }


def _error_samples(results: Iterable[RequestResult]) -> dict[str, str]:
    """The first message of each error class (``detail``; the class itself when none)."""
    samples: dict[str, str] = {}
    for r in results:
        if r.error is not None and r.error not in samples:
            samples[r.error] = r.detail or r.error
    return dict(sorted(samples.items()))


def _hit_rate(ok: Sequence[RequestResult], engine: EngineDelta | None) -> tuple[float, str]:
    """Engine-delivered (metrics deltas) when scraped (``engine_metrics_partial``: some
    instance could not be scraped, the rate is over the others), else from
    ``usage.cached_tokens``."""
    if engine is not None and engine.hit_rate is not None:
        return engine.hit_rate, "engine_metrics_partial" if engine.missing else "engine_metrics"
    # vLLM reports cached_tokens only with --enable-prompt-tokens-details, and then leaves it
    # out when nothing was cached: once any answer carries it, a missing one means 0.
    reported = any(r.cached_tokens is not None for r in ok)
    prompt = cached = 0
    for r in ok:
        if r.prompt_tokens is not None and reported:
            prompt += r.prompt_tokens
            cached += r.cached_tokens or 0
    if prompt:
        return cached / prompt, "usage_cached_tokens"
    return 0.0, "unknown"


async def measure(
    requests: Sequence[WorkloadRequest],
    spec: LoadSpec,
    targets: Sequence[MetricsTarget] = (),
    *,
    instances: Sequence[str] = (),
    reuse_bounds: Mapping[str, float] | None = None,
    on_done: Callable[[RequestResult], None] | None = None,
    on_unscraped: Callable[[Sequence[str]], None] | None = None,
) -> tuple[LoadResult, dict[str, object]]:
    """Scrape ``targets``, run the load, scrape again; the load and its summary.
    ``on_unscraped`` gets the targets whose metrics could not be read before or after the run
    (their counts are left out of the figures), when there are any."""
    before = await scrape(targets) if targets else {}
    load = await run_load(requests, spec, on_done)
    engine = engine_delta(before, await scrape(targets)) if targets else None
    if engine is not None and engine.missing and on_unscraped is not None:
        on_unscraped(engine.missing)
    names = list(instances) or [t.instance for t in targets]
    return load, summarize(load, engine, names, reuse_bounds)
