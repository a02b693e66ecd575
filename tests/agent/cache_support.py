"""Shared helpers for the agent tests (real servers on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from harness.audit import published_corrupt_or_partial as audit
from warmfleet.agent.manager import CacheManager
from warmfleet.agent.sourceset import SourceSet
from warmfleet.agent.store import Store
from warmfleet.cache.config import (
    CapacitySpec,
    DownloadSpec,
    NodeCacheConfig,
    NodeCacheSpec,
    SourcesSpec,
    load_node_config,
)


def spec_for(root: Path, budget: int = 10**9, **download: Any) -> NodeCacheSpec:
    dl = {"chunk": 256 * 1024, "concurrency": 4, "backoff_base_s": 0.01, "fsync_every_s": 0.05}
    dl.update(download)
    sources = dl.pop("sources", SourcesSpec())
    reserve = dl.pop("reserve", 0)
    return NodeCacheSpec(
        root=str(root),
        capacity=CapacitySpec(
            budget=budget, reserve=reserve, high_watermark_frac=1.0, low_watermark_frac=1.0
        ),
        download=DownloadSpec(**dl),
        sources=sources,
    )


def agent_config(root: Path, rest: str) -> NodeCacheConfig:
    """A node.yaml for an in-process agent under ``root``: a 50 MB budget, small chunks, the
    status API on a free port, then ``rest`` (more ``spec`` lines, indented by two)."""
    return load_node_config(
        f"""
apiVersion: warmfleet.dev/v1alpha1
kind: NodeCacheConfig
spec:
  root: {root}
  capacity: {{budget: 50MB, reserve: 0}}
  download: {{chunk: 128KiB, concurrency: 2, fsyncEveryS: 0.05}}
  status: {{host: 127.0.0.1, port: 0}}
{rest}"""
    )


async def wait_for(pred: Callable[[], Any], timeout_s: float = 20.0) -> None:
    """Until the coroutine function ``pred`` returns true (fails after ``timeout_s``)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def manager_for(
    root: Path, free_bytes_fn: Callable[[], int] | None = None, **kw: Any
) -> AsyncIterator[CacheManager]:
    spec = spec_for(root, **kw)
    async with SourceSet(spec.sources, spec.download) as sources:
        yield CacheManager(Store(root), spec, sources, free_bytes_fn=free_bytes_fn)


def published_corrupt_or_partial(root: Path, truth: dict[str, bytes]) -> int:
    """Published artifacts that are partial or differ from any genuine origin content."""
    return audit(root, (hashlib.sha256(v).hexdigest() for v in truth.values()))
