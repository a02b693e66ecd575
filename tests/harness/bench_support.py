"""What the cache benchmarks share: a cache manager on a scratch root, incompressible files."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from warmfleet.agent.manager import CacheManager
from warmfleet.agent.sourceset import SourceSet
from warmfleet.agent.store import Store
from warmfleet.cache.config import CapacitySpec, DownloadSpec, NodeCacheSpec, SourcesSpec

MB = 10**6
GB = 10**9


def spec_for(root: Path, budget: int, **download: Any) -> NodeCacheSpec:
    sources = download.pop("sources", SourcesSpec())
    dl = {"chunk": 8 << 20, "concurrency": 8, **download}
    return NodeCacheSpec(
        root=str(root),
        capacity=CapacitySpec(budget=budget, high_watermark_frac=1.0, low_watermark_frac=1.0),
        download=DownloadSpec(**dl),
        sources=sources,
    )


@contextlib.asynccontextmanager
async def manager_for(root: Path, budget: int = 100 * GB, **download: Any) -> Any:
    spec = spec_for(root, budget, **download)
    async with SourceSet(spec.sources, spec.download) as sources:
        yield CacheManager(Store(root), spec, sources)


def write_pseudo_random(path: Path, size: int) -> None:
    """Incompressible-looking data without paying urandom for every byte."""
    block = os.urandom(16 << 20)
    with path.open("wb") as fh:
        left = size
        while left > 0:
            n = min(len(block), left)
            fh.write(block[:n])
            left -= n
            block = block[1:] + block[:1]


def warm(path: Path) -> None:
    with path.open("rb") as fh:
        while fh.read(16 << 20):
            pass
