"""A source listing the store cannot lay out (NUL byte, a component over 255 bytes, a file that
is also a directory), more files than the process may open, or any other failure after
admission must never wedge the cache: nothing stays "downloading" holding its reservation, a
good model is admitted next, and the agent does not log a traceback at every reconcile."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cache_support import published_corrupt_or_partial

from warmfleet.agent.manager import IN_PROGRESS, CacheManager
from warmfleet.agent.node_agent import NodeAgent
from warmfleet.agent.sources.http import HttpSource
from warmfleet.agent.sourceset import SourceSet
from warmfleet.agent.store import Store
from warmfleet.agent.testing.origin import Blob
from warmfleet.cache.capacity import occupied_bytes
from warmfleet.cache.config import load_node_config
from warmfleet.cache.state import ArtifactState

BAD_BYTES, GOOD_BYTES = 800_000, 400_000  # of a 1 MB budget: both never fit at once


def _config(root: Path, url: str, bad_uri: str, good_uri: str, budget: str = "1MB"):
    return load_node_config(
        f"""
apiVersion: warmfleet.dev/v1alpha1
kind: NodeCacheConfig
spec:
  root: {root}
  capacity: {{budget: {budget}, reserve: 0, high_watermark_frac: 1.0, low_watermark_frac: 1.0}}
  download: {{chunk: 128KiB, concurrency: 2, fsync_every_s: 0.05, backoff_base_s: 0.01}}
  sources: {{hf_endpoint: "{url}"}}
  artifacts:
    - {{type: model, name: bad, uri: "{bad_uri}"}}
    - {{type: model, name: good, uri: "{good_uri}"}}
"""
    )


async def _reconcile_twice(cfg, caplog) -> list:
    agent = NodeAgent(cfg)
    async with SourceSet(cfg.spec.sources, cfg.spec.download) as sources:
        manager = CacheManager(Store(Path(cfg.spec.root)), cfg.spec, sources)
        with caplog.at_level(logging.WARNING):
            await agent.reconcile_once(manager)
            first = [r for r in caplog.records if r.exc_info]
            caplog.clear()
            await agent.reconcile_once(manager)
        assert not [r for r in caplog.records if r.exc_info], "a traceback at every reconcile"
        records = manager.records()
    assert not [r for r in records if r.state in IN_PROGRESS]  # nothing left holding space
    (good,) = [r for r in records if r.name == "good"]
    assert good.state == ArtifactState.READY  # admitted: the bad one reserves nothing
    assert occupied_bytes(records) == GOOD_BYTES
    return first


@pytest.mark.parametrize(
    ("names", "why"),
    [
        ({"w\0.bin": BAD_BYTES}, "NUL byte"),
        ({"x" * 300 + ".bin": BAD_BYTES}, "longer than 255 bytes"),
        ({"a": 10, "a/b": BAD_BYTES - 10}, "both a file and a directory"),
    ],
    ids=["nul", "long-component", "file-dir-clash"],
)
async def test_bad_names_are_refused_before_admission(origin, tmp_path, caplog, names, why):
    org, url = origin
    org.put_repo("org/bad", {n: os.urandom(size) for n, size in names.items()}, lfs=set(names))
    good = {"model.safetensors": os.urandom(GOOD_BYTES)}
    org.put_repo("org/good", good, lfs=set(good))
    cfg = _config(tmp_path / "cache", url, "hf://org/bad", "hf://org/good")
    first = await _reconcile_twice(cfg, caplog)
    assert not first  # refused with a clear error, not a traceback
    bad_warnings = [r.getMessage() for r in caplog.records if "bad" in r.getMessage()]
    assert bad_warnings
    assert all(why in m for m in bad_warnings), bad_warnings
    assert not [r for r in Store(tmp_path / "cache").read_index() if r.name == "bad"]
    assert not any((tmp_path / "cache" / "staging").iterdir())


async def test_any_failure_after_admission_fails_the_artifact_and_frees_it(
    origin, tmp_path, caplog, monkeypatch
):
    org, url = origin
    org.put("bad.bin", Blob(data=os.urandom(BAD_BYTES)))
    good = org.put("good.bin", Blob(data=os.urandom(GOOD_BYTES)))
    real = HttpSource.open_range

    def exploding(self, entry, start, end):
        if entry.path == "bad.bin":  # a bug in a source, an unexpected OSError...
            raise ValueError("embedded null byte")
        return real(self, entry, start, end)

    monkeypatch.setattr(HttpSource, "open_range", exploding)
    # room for both: the second reconcile fetches the bad one again (and fails again)
    uris = (f"{url}/files/bad.bin", f"{url}/files/good.bin")
    cfg = _config(tmp_path / "cache", url, *uris, budget="1300000")
    first = await _reconcile_twice(cfg, caplog)
    assert len(first) == 1  # logged once with its traceback, not at every reconcile
    (bad,) = [r for r in Store(tmp_path / "cache").read_index() if r.name == "bad"]
    assert bad.state == ArtifactState.FAILED
    assert bad.reason == "ValueError: embedded null byte"
    assert any("embedded null byte" in r.getMessage() for r in caplog.records)  # tried again
    assert published_corrupt_or_partial(tmp_path / "cache", {"good": good.data or b""}) == 0


def test_more_files_than_the_open_file_limit(tmp_path):
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
        "  download: {chunk: 64KiB, concurrency: 4, fsync_every_s: 0.05, max_open_files: 8}\n"
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
