"""Per-artifact live status (bytes, rate, ETA, times) and the wall clock used for LRU."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from warmfleet.agent.metrics import CacheMetrics
from warmfleet.cache.manifest import Manifest
from warmfleet.cache.state import ArtifactState
from warmfleet.cache.transfer import RateMeter
from warmfleet.core.progress import format_bytes, format_seconds


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

    @classmethod
    def starting(cls, manifest: Manifest, name: str, now_s: float) -> ArtifactStatus:
        """A download of ``manifest`` about to start (pending, nothing done)."""
        return cls(
            manifest.key(), name, manifest.uri, ArtifactState.PENDING, 0, manifest.size_bytes,
            started_at=now_s,
        )  # fmt: skip

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


def fetch_start_text(name: str, manifest: Manifest) -> str:
    """The agent's log line when a download starts."""
    size = format_bytes(manifest.size_bytes)
    files = f"{len(manifest.files)} file" + ("" if len(manifest.files) == 1 else "s")
    return f"fetching {name} ({manifest.key()[:16]}) from {manifest.uri}: {size} in {files}"


def fetch_done_text(name: str, manifest: Manifest, took_s: float, path: Path) -> str:
    """The agent's log line when a download is verified and published (served from ``path``)."""
    size = manifest.size_bytes
    rate = format_bytes(size / took_s) if took_s > 0 else "-"
    return (
        f"fetched {name} ({manifest.key()[:16]}): {format_bytes(size)} in "
        f"{format_seconds(took_s)} ({rate}/s); serving it from {path}"
    )
