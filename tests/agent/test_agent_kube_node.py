"""The node agent's Kubernetes side against kmock's API emulator: it reads the caches assigned
to its Node, fills them, shows each ready one as ``<root>/<cache>/`` with the ready marker and
reports in the Node's ``cache-status`` annotation; unassigned caches lose their view and data."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cache_support import agent_config, wait_for

from harness.origin import Blob
from warmfleet.agent.cache_links import READY_MARKER, CacheLinks
from warmfleet.agent.kube_node import parse_assignments
from warmfleet.agent.node_agent import NodeAgent
from warmfleet.api.names import ANN_ASSIGNED, ANN_CACHE_STATUS
from warmfleet.api.resources import ModelSource
from warmfleet.control.actions import NodeCacheAssignment
from warmfleet.operator import render

NODE = "gpu-node-0"


def _config(root: Path, api: str, host_path: str, interval_s: float) -> Any:
    return agent_config(
        root,
        f"""  reconcileIntervalS: 30
  kubernetes:
    apiServer: "{api}"
    hostPath: {host_path}
    nodeName: {NODE}
    intervalS: {interval_s}
    tokenPath: /nonexistent/token
    caPath: /nonexistent/ca.crt
""",
    )


@pytest.mark.parametrize("interval_s", [0.05, 60.0], ids=["polled", "event-driven"])
async def test_agent_serves_its_nodes_assignments(
    kmock: Any, origin: Any, tmp_path: Path, interval_s: float
) -> None:
    """With a long interval every step must come from the Node watch or a fetch's end."""
    org, url = origin
    weights = os.urandom(300_000)
    org.put("w.bin", Blob(data=weights))
    kmock.resources["v1/nodes"] = kmock.ResourceInfo(
        kind="Node", namespaced=False, verbs=["get", "list", "watch", "create", "patch"]
    )
    api = str(kmock.url).rstrip("/")
    node_url = f"{api}/api/v1/nodes/{NODE}"
    host_path = "/opt/warmfleet/cache"
    assigned = [
        {
            "cache": "llama-w-1",
            "uri": f"{url}/files/w.bin",
            "revision": "v1",
            "hostPath": host_path,
        },
        {"cache": "other-w-2", "uri": f"{url}/files/w.bin", "hostPath": "/somewhere/else"},
    ]
    agent = NodeAgent(_config(tmp_path, api, host_path, interval_s))
    async with aiohttp.ClientSession() as http:
        meta = {"name": NODE, "annotations": {ANN_ASSIGNED: json.dumps(assigned)}}
        await http.post(f"{api}/api/v1/nodes", json={"metadata": meta})

        async def status() -> dict[str, Any]:
            async with http.get(node_url) as resp:
                node = await resp.json()
            report: dict[str, Any] = json.loads(
                node["metadata"]["annotations"].get(ANN_CACHE_STATUS, "{}")
            )
            return report

        async def ready() -> bool:
            state: str | None = (await status()).get("llama-w-1", {}).get("state")
            return state == "ready"

        run = asyncio.create_task(agent.run())
        try:
            await wait_for(ready)
            report = await status()
            assert report["llama-w-1"]["bytesTotal"] == 300_000
            assert report["llama-w-1"]["healthy"] is True
            assert report["llama-w-1"]["path"] == f"{host_path}/llama-w-1"
            assert report["other-w-2"]["healthy"] is False  # another hostPath: not served here
            assert "/somewhere/else" in report["other-w-2"]["message"]
            view = tmp_path / "llama-w-1"
            assert json.loads((view / READY_MARKER).read_text())["key"]
            assert (view / "w.bin").read_bytes() == weights
            assert (view / "w.bin").is_symlink()
            assert not os.path.isabs(os.readlink(view / "w.bin"))  # valid in the pod's mount
            assert not (tmp_path / "other-w-2").exists()

            # unassigned: the view goes (marker first), the data is evicted, the report drops it
            patch = {"metadata": {"annotations": {ANN_ASSIGNED: "[]"}}}
            await http.patch(node_url, json=patch)

            async def gone() -> bool:
                return not view.exists() and await status() == {}

            await wait_for(gone)
            assert not any((tmp_path / "objects").iterdir())
            assert agent.kube is not None
            assert agent.kube.errors == 0
        finally:
            agent.stop_event.set()
            await asyncio.wait_for(run, 10)


async def test_a_cache_is_never_reported_ready_before_its_view_exists(
    kmock: Any, origin: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fetch that ends while the views are synced (on a thread) was reported ready with no
    path (the report read the records again after the views were made)."""
    org, url = origin
    org.put("w.bin", Blob(data=os.urandom(300_000)))
    kmock.resources["v1/nodes"] = kmock.ResourceInfo(
        kind="Node", namespaced=False, verbs=["get", "list", "watch", "create", "patch"]
    )
    slow_sync = CacheLinks.sync

    def sync(self: CacheLinks, usable: dict[str, str]) -> None:
        time.sleep(0.2)  # the fetch of 300 kB ends meanwhile
        slow_sync(self, usable)

    monkeypatch.setattr(CacheLinks, "sync", sync)
    api = str(kmock.url).rstrip("/")
    host_path = "/opt/warmfleet/cache"
    assigned = [{"cache": "llama-w-1", "uri": f"{url}/files/w.bin", "hostPath": host_path}]
    agent = NodeAgent(_config(tmp_path, api, host_path, 60.0))
    async with aiohttp.ClientSession() as http:
        meta = {"name": NODE, "annotations": {ANN_ASSIGNED: json.dumps(assigned)}}
        await http.post(f"{api}/api/v1/nodes", json={"metadata": meta})
        run = asyncio.create_task(agent.run())
        try:

            async def ready() -> bool:
                return (tmp_path / "llama-w-1" / READY_MARKER).exists()

            await wait_for(ready)
            await asyncio.sleep(0.5)  # the report that follows the view
        finally:
            agent.stop_event.set()
            await asyncio.wait_for(run, 10)
    reports = [
        json.loads(version["metadata"]["annotations"].get(ANN_CACHE_STATUS, "{}"))
        for version in kmock.objects["v1/nodes", None, NODE].history
        if version is not None
    ]
    states = [(r["llama-w-1"]["state"], r["llama-w-1"]["path"]) for r in reports if r]
    assert ("ready", f"{host_path}/llama-w-1") in states
    assert ("ready", "") not in states, states


def test_parse_assignments() -> None:
    good = {"cache": "a-w-1", "uri": "s3://m/a", "revision": "r1", "hostPath": "/cache/"}
    servable, refused = parse_assignments(
        json.dumps([good, {"cache": "b", "hostPath": "/cache"}, {"cache": "../x", "uri": "u"}]),
        "/cache",
    )
    assert list(servable) == ["a-w-1"]
    assert servable["a-w-1"].revision == "r1"
    assert refused == {"b": "the assignment has no uri"}
    assert parse_assignments(None, "/cache") == ({}, {})
    with pytest.raises(ValueError, match="not a JSON list"):
        parse_assignments('{"cache": "a"}', "/cache")
    with pytest.raises(json.JSONDecodeError):
        parse_assignments("not json", "/cache")


def test_the_operator_annotation_is_what_the_agent_reads() -> None:
    """``render.assignments`` (operator) and ``parse_assignments`` (agent) agree on the format."""
    caches = (
        NodeCacheAssignment("ep-w-1", ModelSource(uri="s3://m/a", revision="v2"), "/cache"),
        NodeCacheAssignment("ep-w-2", ModelSource(uri="hf://org/m"), "/cache/"),
        NodeCacheAssignment("other-w-1", ModelSource(uri="s3://m/b"), "/elsewhere"),
    )
    servable, refused = parse_assignments(render.assignments(caches), "/cache")
    assert {k: (a.uri, a.revision) for k, a in servable.items()} == {
        "ep-w-1": ("s3://m/a", "v2"),
        "ep-w-2": ("hf://org/m", ""),
    }
    assert list(refused) == ["other-w-1"]
