"""Per-artifact live status (bytes, rate, ETA, times) and the wall clock used for LRU."""

from __future__ import annotations

import time
from dataclasses import dataclass

from warmfleet.agent.metrics import CacheMetrics
from warmfleet.cache.state import ArtifactState
from warmfleet.cache.transfer import RateMeter


class WallClock:
    def now_s(self) -> float:
        return time.time()


@dataclass
class ArtifactStatus:
    key: str
    name: str
    uri: str
    state: ArtifactState
    bytes_done: int
    bytes_total: int
    rate_bps: float = 0.0
    eta_s: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    reason: str = ""
    retries: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "key": self.key,
            "name": self.name,
            "uri": self.uri,
            "state": self.state.value,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "rate_bps": round(self.rate_bps, 1),
            "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "reason": self.reason,
            "retries": self.retries,
        }


@dataclass
class DownloadProgress:
    """The downloader's callbacks for one artifact: live status and metrics."""

    status: ArtifactStatus
    meter: RateMeter
    metrics: CacheMetrics
    kind: str

    def on_bytes(self, n: int) -> None:
        self.meter.add(n)
        self.status.bytes_done = self.meter.done_bytes
        self.status.rate_bps, self.status.eta_s = self.meter.rate_bps(), self.meter.eta_s()
        if n > 0:
            self.metrics.downloaded_bytes.labels(self.kind).inc(n)

    def on_retry(self, reason: str) -> None:
        self.status.retries += 1
        self.metrics.retries.labels(reason).inc()
