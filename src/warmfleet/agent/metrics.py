"""Prometheus metrics of one node agent, on its own registry (no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._downloads(self.registry)
        self._store(self.registry)
        self._failures(self.registry)

    def _downloads(self, r: CollectorRegistry) -> None:
        """Prefetches: bytes, results, durations, retries."""
        self.downloaded_bytes = Counter(
            "warmfleet_cache_downloaded_bytes", "Bytes written to staging", ["source"], registry=r
        )
        self.downloads = Counter(
            "warmfleet_cache_downloads", "Finished prefetches", ["source", "result"], registry=r
        )
        self.download_seconds = Histogram(
            "warmfleet_cache_download_seconds",
            "Wall time of a prefetch (resolve to publish)",
            ["source"],
            buckets=(0.1, 0.5, 1, 5, 15, 60, 300, 900, 1800, 3600),
            registry=r,
        )
        self.retries = Counter(
            "warmfleet_cache_retries", "Chunk retries by reason", ["reason"], registry=r
        )

    def _store(self, r: CollectorRegistry) -> None:
        """The store: its budget and use, artifacts by state and each one's progress."""
        self.evictions = Counter("warmfleet_cache_evictions", "Evicted artifacts", registry=r)
        self.evicted_bytes = Counter("warmfleet_cache_evicted_bytes", "Evicted bytes", registry=r)
        self.used_bytes = Gauge("warmfleet_cache_used_bytes", "Bytes held or reserved", registry=r)
        self.budget_bytes = Gauge("warmfleet_cache_budget_bytes", "Configured budget", registry=r)
        self.free_bytes = Gauge("warmfleet_cache_fs_free_bytes", "File system free", registry=r)
        self.artifacts = Gauge(
            "warmfleet_cache_artifacts", "Artifacts by state", ["state"], registry=r
        )
        self.progress_bytes = Gauge(
            "warmfleet_cache_artifact_done_bytes",
            "Bytes done per artifact",
            ["name", "key"],
            registry=r,
        )
        self.total_bytes = Gauge(
            "warmfleet_cache_artifact_total_bytes",
            "Bytes total per artifact",
            ["name", "key"],
            registry=r,
        )

    def _failures(self, r: CollectorRegistry) -> None:
        """Verification failures, and prefetches that failed before admission."""
        self.integrity_failures = Counter(
            "warmfleet_cache_integrity_failures",
            "Verification failures (never published)",
            registry=r,
        )
        self.unadmitted = Gauge(
            "warmfleet_cache_unadmitted_artifacts",
            "Configured or assigned artifacts whose latest prefetch failed before admission "
            "(no record), by error class",
            ["reason"],
            registry=r,
        )
        self.unadmitted_failures = Counter(
            "warmfleet_cache_unadmitted_failures",
            "Prefetch attempts that failed before admission, by error class",
            ["reason"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
