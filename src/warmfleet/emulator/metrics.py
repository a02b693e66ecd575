"""vLLM-named Prometheus metrics of one emulated instance, in its own ``CollectorRegistry``.

Prefix-cache counters and the running/waiting/KV-usage gauges are read from the engine model at
scrape time (so ``vllm:prefix_cache_hits_total`` is exactly the sum of the ``cached_tokens`` the
engine served); the rest are updated as requests progress. Every series carries vLLM's
``model_name`` and ``engine`` labels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from warmfleet.engine.events import EngineStats
from warmfleet.engine.spec import EngineSpec

CONTENT_TYPE = CONTENT_TYPE_LATEST
# vLLM's buckets for time to first token and end-to-end latency (seconds).
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
E2E_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
REQUEST_PARAMS_N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)  # vLLM's, for vllm:request_params_n
_LABELS = ("model_name", "engine")


def token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's buckets for per-request token counts (``build_1_2_5_buckets(max_model_len)``):
    1, 2, 5, 10, 20, 50, ... up to ``max_model_len``."""
    out: list[float] = []
    magnitude = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * magnitude
            if value > max_model_len:
                return tuple(out)
            out.append(float(value))
        magnitude *= 10


class _EngineCollector(Collector):
    def __init__(self, stats: Callable[[], EngineStats | None], labels: tuple[str, str]) -> None:
        self._stats = stats
        self._labels = list(labels)

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        if stats is None:
            return
        labels = self._labels
        queries = CounterMetricFamily(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            labels=_LABELS,
        )
        queries.add_metric(labels, stats.prefix_cache_queries_tokens)
        hits = CounterMetricFamily(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            labels=_LABELS,
        )
        hits.add_metric(labels, stats.prefix_cache_hits_tokens)
        yield queries
        yield hits
        for name, doc, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", 0),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", 1),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", 2),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=_LABELS)
            gauge.add_metric(labels, (stats.running, stats.waiting, stats.kv_usage_frac)[value])
            yield gauge


class InstanceMetrics:
    """The metrics of one instance (one per listener incarnation)."""

    def __init__(
        self,
        model_name: str,
        spec: EngineSpec,
        stats: Callable[[], EngineStats | None],
    ) -> None:
        self.registry = reg = CollectorRegistry(auto_describe=True)
        self._labels = labels = (model_name, "0")
        self.registry.register(_EngineCollector(stats, labels))
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", _LABELS, registry=reg
        ).labels(*labels)
        self.generation_tokens = Counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            _LABELS,
            registry=reg,
        ).labels(*labels)
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*_LABELS, "finished_reason"],
            registry=reg,
        )
        self._latency_histograms()
        self._token_histograms(token_buckets(spec.max_model_len))
        self._info(spec)

    def _latency_histograms(self) -> None:
        self.ttft_s = self._histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS_S,
        )
        self.e2e_s = self._histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            E2E_BUCKETS_S,
        )
        self.params_n = self._histogram(
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            REQUEST_PARAMS_N_BUCKETS,
        )

    def _token_histograms(self, tokens: tuple[float, ...]) -> None:
        self.request_prompt_tokens = self._histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.request_generation_tokens = self._histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.max_num_generation_tokens = self._histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        )
        self.params_max_tokens = self._histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            tokens,
        )

    def _info(self, spec: EngineSpec) -> None:
        """vLLM's cache config (an info gauge) and the emulator's own fault counter."""
        reg = self.registry
        cache_info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ["block_size", "num_gpu_blocks", "enable_prefix_caching"],
            registry=reg,
        )
        cache_info.labels(str(spec.block_tokens), str(spec.capacity_blocks), "True").set(1)
        self.faults = Counter(
            "warmfleet_emulator_faults",
            "Faults injected by the emulator, by kind.",
            ["kind"],
            registry=reg,
        )

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        """A histogram with vLLM's labels, its one series already created."""
        family = Histogram(name, doc, _LABELS, buckets=buckets, registry=self.registry)
        return family.labels(*self._labels)

    def request_finished(self, finished_reason: str) -> None:
        self._success.labels(*self._labels, finished_reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
