"""The engines' own queue and KV usage, polled from their Prometheus metrics for the strategies
that read them (``InstanceState.waiting_requests`` and ``kv_usage_frac``; today
``llmd_approx``, whose ``refreshMetricsIntervalMs`` is llm-d's ``--refresh-metrics-interval``).

- vLLM: ``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc`` (before V1:
  ``vllm:gpu_cache_usage_perc``).
- SGLang: ``sglang:num_queue_reqs`` and ``sglang:token_usage``.
- The emulator exports vLLM's series; a server without them keeps 0 (unknown).

Queues of several engines behind one address (data-parallel ranks) add up; their KV usage is
the highest. Owned by the app lifespan (``run``, cancelled on shutdown). Each round reads, at
once, the ``/metrics`` of every instance address of the variants whose strategy asks for them
(their router's ``engine_stats_interval_s``), on the probe's own connection pool, each read
timed from when it has its slot (``gateway.probes``: addresses whose ``/metrics`` hangs never
fail the others' reads), then sleeps the shortest interval asked; no variant asks: nothing is
read. Only the few lines named above are parsed (a vLLM ``/metrics``
page is tens of kB of histograms, read up to 20 times a second). A read that fails changes
nothing until the figures are ``STALE_AFTER_INTERVALS`` intervals (at least ``STALE_MIN_S``)
old; then they are reset to unknown, as they are for an instance the health probes see down
and for the instances of a variant whose strategy stopped asking.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from warmfleet.gateway.instance import InstanceRuntime
from warmfleet.gateway.kv_capacity import MetricsPoller, metrics_text

IDLE_S = 1.0  # no variant asks: look again this much later (a reload may add one)
STALE_AFTER_INTERVALS = 10
STALE_MIN_S = 2.0
_WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")


def _values(text: str, name: str) -> list[float]:
    """The values of the sample lines of series ``name``, found with ``str.find``: a vLLM page
    is tens of kB of histograms (an 80 kB page: 85 µs for the five series, against 0.5 ms with
    a regular expression and 16 ms with ``prometheus_client``'s parser). A value that is not a
    finite, non-negative number is left out."""
    out: list[float] = []
    start = 0
    while (at := text.find(name, start)) >= 0:
        start = at + len(name)
        if at and text[at - 1] != "\n":  # in a comment, or inside another series' name
            continue
        end = text.find("\n", start)
        rest = text[start : len(text) if end < 0 else end]
        if rest.startswith("{"):
            rest = rest[rest.rfind("}") + 1 :]
        elif rest[:1] not in (" ", "\t"):  # another series whose name starts the same
            continue
        fields = rest.split()
        try:
            value = float(fields[0]) if fields else math.nan
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            out.append(value)
    return out


def engine_stats(text: str) -> tuple[int, float] | None:
    """The waiting requests and KV usage (in [0, 1]) an engine's metrics state; None if they
    state neither."""
    waiting = [v for name in _WAITING for v in _values(text, name)]
    usage = [v for name in _USAGE for v in _values(text, name)]
    if not waiting and not usage:
        return None
    return int(sum(waiting)), min(max(usage, default=0.0), 1.0)


@dataclass(eq=False)
class EngineStatsProbe(MetricsPoller):
    """Polls the engines' queue and KV usage into their ``InstanceRuntime`` (module docstring);
    built as ``MetricsPoller`` is."""

    async def run(self) -> None:
        while True:
            interval_s = await self.poll_once()
            await asyncio.sleep(IDLE_S if interval_s is None else interval_s)

    async def poll_once(self) -> float | None:
        """One round: the shortest interval the variants ask for (None: none asks)."""
        interval_s: float | None = None
        targets: dict[str, list[InstanceRuntime]] = {}
        for variant in self.state.variants():
            wanted_s = variant.router.engine_stats_interval_s
            if wanted_s is None:  # (its strategy may have changed: nothing stale is shown)
                for inst in variant.instances.values():
                    inst.set_engine_stats(0, 0.0)
                continue
            interval_s = wanted_s if interval_s is None else min(interval_s, wanted_s)
            for inst in variant.instances.values():
                if inst.active_healthy:
                    targets.setdefault(inst.base_url, []).append(inst)
                else:
                    inst.set_engine_stats(0, 0.0)
        if interval_s is None:
            return None
        urls = list(targets)
        timeout_s = min(self.state.health.timeout_s, max(4 * interval_s, 0.25))
        results = await asyncio.gather(*(self.read(url, timeout_s) for url in urls))
        now_s = self.clock()
        stale_s = max(STALE_MIN_S, STALE_AFTER_INTERVALS * interval_s)
        for url, stats in zip(urls, results, strict=True):
            for inst in targets[url]:
                if inst.removed:
                    continue
                if stats is not None:
                    inst.set_engine_stats(*stats, read_s=now_s)
                elif now_s - inst.engine_stats_read_s > stale_s:  # unknown from now on
                    inst.set_engine_stats(0, 0.0)
        self.rounds_completed += 1
        return interval_s

    async def read(self, base_url: str, timeout_s: float) -> tuple[int, float] | None:
        """What ``base_url``'s metrics state; None if they could not be read or state nothing."""
        text = await metrics_text(self.prober, base_url, timeout_s)
        return None if text is None else engine_stats(text)
