"""The node agent in-process: reconcile loop, roll-over on change, status API and metrics."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
from cache_support import agent_config, wait_for

from harness.origin import Blob, Origin
from warmfleet.agent.node_agent import NodeAgent
from warmfleet.cache.config import NodeCacheConfig


def _config(root: Path, url: str, interval_s: float = 0.1) -> NodeCacheConfig:
    return agent_config(
        root,
        f"""  reconcileIntervalS: {interval_s}
  artifacts:
    - {{type: model, name: weights, uri: "{url}/files/w.bin", pin: true}}
""",
    )


async def test_agent_serves_status_and_rolls_over(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    org, url = origin
    v1, v2 = os.urandom(400_000), os.urandom(400_000)
    org.put("w.bin", Blob(data=v1, mtime_s=1))
    org.put("extra.bin", Blob(data=b"e" * 1000))
    agent = NodeAgent(_config(tmp_path, url))
    run = asyncio.create_task(agent.run())
    async with aiohttp.ClientSession() as http:

        async def status() -> dict[str, Any]:
            if agent.port == 0:
                return {"artifacts": []}
            async with http.get(f"http://127.0.0.1:{agent.port}/v1/status") as resp:
                doc: dict[str, Any] = await resp.json()
                return doc

        async def ready(name: str, n: int = 1) -> bool:
            count: int = sum(
                a["name"] == name and a["state"] == "ready" for a in (await status())["artifacts"]
            )
            return count >= n

        await wait_for(lambda: ready("weights"))
        doc = await status()
        (art,) = doc["artifacts"]
        assert art["pinned"]
        assert art["refs"] == ["config:weights"]
        assert art["bytes_done"] == 400_000
        assert doc["node"]["budget_bytes"] == 50_000_000
        org.put("w.bin", Blob(data=v2, mtime_s=2))  # changed in place at the same URI
        await wait_for(lambda: ready("weights", 2))
        arts = {a["key"]: a for a in (await status())["artifacts"]}
        current = [a for a in arts.values() if a["refs"] == ["config:weights"]]
        old = [a for a in arts.values() if not a["refs"]]
        assert len(current) == 1
        assert len(old) == 1
        assert not old[0]["pinned"]
        async with http.post(
            f"http://127.0.0.1:{agent.port}/v1/prefetch",
            json={"uri": f"{url}/files/extra.bin", "name": "extra", "holder": "ctl"},
        ) as resp:
            assert resp.status == 202
        await wait_for(lambda: ready("extra"))
        async with http.get(f"http://127.0.0.1:{agent.port}/v1/artifacts/extra") as resp:
            assert (await resp.json())["refs"] == ["ctl"]
        async with http.get(f"http://127.0.0.1:{agent.port}/v1/artifacts/nope") as resp:
            assert resp.status == 404
        async with http.get(f"http://127.0.0.1:{agent.port}/metrics") as resp:
            text = await resp.text()
        assert "warmfleet_cache_downloaded_bytes_total" in text
        assert 'warmfleet_cache_artifacts{state="ready"} 3.0' in text
    agent.stop_event.set()
    await asyncio.wait_for(run, 10)


async def test_agent_reverifies_at_start_and_refetches_damaged(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
    org, url = origin
    data = os.urandom(300_000)
    org.put("w.bin", Blob(data=data))
    cfg = _config(tmp_path, url, interval_s=30)
    first = NodeAgent(cfg)
    run = asyncio.create_task(first.run())
    await wait_for(lambda: _has_object(tmp_path))
    first.stop_event.set()
    await asyncio.wait_for(run, 10)
    (obj,) = (tmp_path / "objects").iterdir()
    with (obj / "w.bin").open("r+b") as fh:
        fh.truncate(1000)  # damaged while the agent was down
    second = NodeAgent(cfg)
    run = asyncio.create_task(second.run())
    await wait_for(lambda: _file_is(obj / "w.bin", data))
    second.stop_event.set()
    await asyncio.wait_for(run, 10)


async def _has_object(root: Path) -> bool:
    objects = root / "objects"
    return objects.exists() and any(objects.iterdir())


async def _file_is(path: Path, data: bytes) -> bool:
    try:
        return path.read_bytes() == data
    except OSError:
        return False
