"""A source listing the store cannot lay out (NUL byte, a component over 255 bytes, a file that
is also a directory), more files than the process may open, or any other failure after
admission must never wedge the cache: nothing stays "downloading" holding its reservation, a
good model is admitted next, and the agent does not log a traceback at every reconcile.

A listing refused before admission has no record, yet the agent shows it: ``failed`` with its
reason in ``/v1/status`` (``unadmitted``), ``GET /v1/artifacts/<name>`` and the metrics; its
warning is logged once per reason, not at every pass; the entry goes once it resolves or leaves
the config."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from cache_support import published_corrupt_or_partial

from harness.origin import Blob, Origin
from warmfleet.agent.manager import IN_PROGRESS, CacheManager
from warmfleet.agent.node_agent import NodeAgent
from warmfleet.agent.sources.http import HttpSource
from warmfleet.agent.sourceset import SourceSet
from warmfleet.agent.status_api import build_app
from warmfleet.agent.store import Store
from warmfleet.cache.capacity import occupied_bytes
from warmfleet.cache.config import NodeCacheConfig, load_node_config
from warmfleet.cache.manifest import FileEntry
from warmfleet.cache.state import ArtifactState

BAD_BYTES, GOOD_BYTES = 800_000, 400_000  # of a 1 MB budget: both never fit at once
UNADMITTED = "warmfleet_cache_unadmitted_artifacts"

Client = TestClient[web.Request, web.Application]


def _config(
    root: Path, url: str, bad_uri: str | None, good_uri: str, budget: str = "1MB"
) -> NodeCacheConfig:
    bad = f'    - {{type: model, name: bad, uri: "{bad_uri}"}}\n' if bad_uri else ""
    return load_node_config(
        f"""
apiVersion: warmfleet.dev/v1alpha1
kind: NodeCacheConfig
spec:
  root: {root}
  capacity: {{budget: {budget}, reserve: 0, highWatermarkFrac: 1.0, lowWatermarkFrac: 1.0}}
  download: {{chunk: 128KiB, concurrency: 2, fsyncEveryS: 0.05, backoffBaseS: 0.01}}
  sources: {{hfEndpoint: "{url}"}}
  artifacts:
{bad}    - {{type: model, name: good, uri: "{good_uri}"}}
"""
    )


@contextlib.asynccontextmanager
async def _agent(cfg: NodeCacheConfig) -> AsyncIterator[tuple[NodeAgent, CacheManager, Client]]:
    """An agent's reconcile pass and its status API (in-process) over one manager."""
    async with SourceSet(cfg.spec.sources, cfg.spec.download) as sources:
        manager = CacheManager(Store(Path(cfg.spec.root)), cfg.spec, sources)
        async with TestClient(TestServer(build_app(manager, asyncio.ensure_future))) as client:
            yield NodeAgent(cfg), manager, client


async def _passes(
    agent: NodeAgent, manager: CacheManager, caplog: pytest.LogCaptureFixture, n: int = 2
) -> list[list[logging.LogRecord]]:
    """The warnings and errors logged by each of ``n`` reconcile passes."""
    out: list[list[logging.LogRecord]] = []
    with caplog.at_level(logging.WARNING):
        for _ in range(n):
            caplog.clear()
            await agent.reconcile_once(manager)
            out.append(list(caplog.records))
    return out


def _good_admitted(manager: CacheManager) -> None:
    records = manager.records()
    assert not [r for r in records if r.state in IN_PROGRESS]  # nothing left holding space
    (good,) = [r for r in records if r.name == "good"]
    assert good.state == ArtifactState.READY  # admitted: the bad one reserves nothing
    assert occupied_bytes(records) == GOOD_BYTES


async def _get(client: Client, path: str) -> tuple[int, Any]:
    """The status code and the JSON document (or, for ``/metrics``, the text) of a GET."""
    resp = await client.get(path)
    return resp.status, await (resp.json() if path != "/metrics" else resp.text())


def _gauge(metrics: str, reason: str) -> float | None:
    line = f'{UNADMITTED}{{reason="{reason}"}} '
    values = [float(x[len(line) :]) for x in metrics.splitlines() if x.startswith(line)]
    return values[0] if values else None


def _mentions(records: list[logging.LogRecord], text: str) -> list[str]:
    return [r.getMessage() for r in records if text in r.getMessage()]


BAD_NAMES = [
    ({"w\0.bin": BAD_BYTES}, "NUL byte"),
    ({"x" * 300 + ".bin": BAD_BYTES}, "longer than 255 bytes"),
    ({"a": 10, "a/b": BAD_BYTES - 10}, "both a file and a directory"),
]


@pytest.mark.parametrize(("names", "why"), BAD_NAMES, ids=["nul", "long-component", "clash"])
async def test_bad_names_are_refused_before_admission(
    origin: tuple[Origin, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    names: dict[str, int],
    why: str,
) -> None:
    org, url = origin
    org.put_repo("org/bad", {n: os.urandom(size) for n, size in names.items()}, lfs=set(names))
    good = {"model.safetensors": os.urandom(GOOD_BYTES)}
    org.put_repo("org/good", good, lfs=set(good))
    cfg = _config(tmp_path / "cache", url, "hf://org/bad", "hf://org/good")
    async with _agent(cfg) as (agent, manager, client):
        passes = await _passes(agent, manager, caplog)
        _good_admitted(manager)
        assert not [r for p in passes for r in p if r.exc_info]  # a clear error, no traceback
        (warning,) = _mentions(passes[0], "bad")  # once, then not at every pass
        assert why in warning
        assert "ManifestError" in warning
        assert not _mentions(passes[1], "bad")
        assert not [r for r in Store(tmp_path / "cache").read_index() if r.name == "bad"]
        assert not any((tmp_path / "cache" / "staging").iterdir())
        code, status = await _get(client, "/v1/status")
        assert code == 200
        assert [a["name"] for a in status["artifacts"]] == ["good"]
        (shown,) = status["unadmitted"]
        assert (shown["name"], shown["state"], shown["key"]) == ("bad", "failed", "")
        assert shown["reason"].startswith("ManifestError: ")
        assert why in shown["reason"]
        assert (shown["uri"], shown["holder"], shown["attempts"]) == (
            "hf://org/bad",
            "config:bad",
            2,
        )
        assert shown["bytes_done"] == 0
        code, doc = await _get(client, "/v1/artifacts/bad")
        assert code == 200
        assert doc["state"] == "failed"
        assert doc["reason"] == shown["reason"]
        assert _gauge((await _get(client, "/metrics"))[1], "ManifestError") == 1.0


async def test_a_refused_listing_is_cleared_once_it_resolves(
    origin: tuple[Origin, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    org, url = origin
    org.put_repo("org/bad", {"w\0.bin": b"x"}, lfs=set())
    org.put_repo("org/good", {"m.bin": os.urandom(GOOD_BYTES)}, lfs={"m.bin"})
    cfg = _config(tmp_path / "cache", url, "hf://org/bad", "hf://org/good")
    async with _agent(cfg) as (agent, manager, client):
        await _passes(agent, manager, caplog, 1)
        assert [u["name"] for u in (await _get(client, "/v1/status"))[1]["unadmitted"]] == ["bad"]
        org.put_repo("org/bad", {"ok.bin": os.urandom(1000)}, lfs=set())  # fixed upstream
        await _passes(agent, manager, caplog, 1)
        status = (await _get(client, "/v1/status"))[1]
        assert status["unadmitted"] == []
        assert {a["name"]: a["state"] for a in status["artifacts"]} == {
            "bad": "ready",
            "good": "ready",
        }
        assert _gauge((await _get(client, "/metrics"))[1], "ManifestError") == 0.0


async def test_a_refused_listing_is_cleared_when_it_leaves_the_config(
    origin: tuple[Origin, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    org, url = origin
    org.put_repo("org/good", {"m.bin": os.urandom(GOOD_BYTES)}, lfs={"m.bin"})
    # no such repository: the origin answers 404 at resolve
    cfg = _config(tmp_path / "cache", url, "hf://org/missing", "hf://org/good")
    async with _agent(cfg) as (agent, manager, client):
        passes = await _passes(agent, manager, caplog)
        assert len(_mentions(passes[0], "bad")) == 1
        assert not _mentions(passes[1], "bad")
        (shown,) = (await _get(client, "/v1/status"))[1]["unadmitted"]
        assert shown["state"] == "failed"
        assert "org/missing" in shown["reason"]
        reason_class = shown["reason"].split(":")[0]
        assert _gauge((await _get(client, "/metrics"))[1], reason_class) == 1.0
        without = NodeAgent(_config(tmp_path / "cache", url, None, "hf://org/good"))
        await _passes(without, manager, caplog, 1)
        assert (await _get(client, "/v1/status"))[1]["unadmitted"] == []
        assert _gauge((await _get(client, "/metrics"))[1], reason_class) == 0.0
        code, _ = await _get(client, "/v1/artifacts/bad")
        assert code == 404


async def test_any_failure_after_admission_fails_the_artifact_and_frees_it(
    origin: tuple[Origin, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    org, url = origin
    org.put("bad.bin", Blob(data=os.urandom(BAD_BYTES)))
    good = org.put("good.bin", Blob(data=os.urandom(GOOD_BYTES)))
    real = HttpSource.open_range
    tried: list[int] = []  # the pass of every attempt
    agents: list[NodeAgent] = []

    def exploding(self: HttpSource, entry: FileEntry, start: int, end: int) -> AsyncIterator[bytes]:
        if entry.path == "bad.bin":  # a bug in a source, an unexpected OSError...
            tried.append(agents[0].reconciles)
            raise ValueError("embedded null byte")
        return real(self, entry, start, end)

    monkeypatch.setattr(HttpSource, "open_range", exploding)
    # room for both: the second reconcile fetches the bad one again (and fails again)
    uris = (f"{url}/files/bad.bin", f"{url}/files/good.bin")
    cfg = _config(tmp_path / "cache", url, *uris, budget="1300000")
    async with _agent(cfg) as (agent, manager, client):
        agents.append(agent)
        passes = await _passes(agent, manager, caplog)
        _good_admitted(manager)
        status = (await _get(client, "/v1/status"))[1]
    assert len([r for r in passes[0] if r.exc_info]) == 1  # logged once with its traceback
    assert not [r for r in passes[1] if r.exc_info]  # not at every reconcile
    assert _mentions(passes[0], "embedded null byte")
    assert not _mentions(passes[1], "embedded null byte")  # the same failure: logged once
    assert set(tried) == {0, 1}  # tried again at the second pass, silently
    (bad,) = [r for r in Store(tmp_path / "cache").read_index() if r.name == "bad"]
    assert bad.state == ArtifactState.FAILED
    assert bad.reason == "ValueError: embedded null byte"
    (shown,) = [a for a in status["artifacts"] if a["name"] == "bad"]  # it has a record
    assert (shown["state"], shown["reason"]) == ("failed", bad.reason)
    assert status["unadmitted"] == []
    assert published_corrupt_or_partial(tmp_path / "cache", {"good": good.data or b""}) == 0


@pytest.mark.slow
def test_more_files_than_the_open_file_limit(tmp_path: Path) -> None:
    """200 files under RLIMIT_NOFILE = 64 (in a child process): never one fd per file."""
    src = tmp_path / "model"
    src.mkdir()
    for i in range(200):
        (src / f"shard-{i:03d}.bin").write_bytes(os.urandom(1000 + i))
    root = tmp_path / "cache"
    cfg = tmp_path / "node.yaml"
    cfg.write_text(
        "apiVersion: warmfleet.dev/v1alpha1\nkind: NodeCacheConfig\nspec:\n"
        f"  root: {root}\n  capacity: {{budget: 1GiB}}\n"
        "  download: {chunk: 64KiB, concurrency: 4, fsyncEveryS: 0.05, maxOpenFiles: 8}\n"
    )
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)); "
        "from warmfleet.agent.cli import cache_app; cache_app()"
    )
    cmd = [sys.executable, "-c", code, "prefetch", str(src), "--config", str(cfg), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    key = json.loads(done.stdout)["key"]
    published = root / "objects" / key
    assert len([p for p in published.iterdir() if p.name.startswith("shard-")]) == 200
    assert (published / "shard-199.bin").read_bytes() == (src / "shard-199.bin").read_bytes()
