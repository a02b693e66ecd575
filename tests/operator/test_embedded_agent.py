"""The embedded node agent as a real child process against the real origin process: assignment,
fill, a deleted cache noticed and refilled, unassignment evicting the data."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from warmfleet.operator.embedded import infra
from warmfleet.operator.embedded.config import origin_file
from warmfleet.operator.embedded.origin_proc import generate_model
from warmfleet.operator.embedded.procs import module_argv, start_child, stop_all, wait_ready

SIZE = 3_000_000


async def _until(what: str, check: Callable[[], Any], timeout_s: float = 30.0) -> None:
    for _ in range(int(timeout_s / 0.1)):
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out: {what}")


async def test_agent_fills_notices_deletion_refills_and_evicts(tmp_path: Path) -> None:
    generate_model(tmp_path / "origin" / origin_file("m", "v1"), SIZE, "m@v1")
    origin = await start_child(
        "origin",
        module_argv(
            infra.ORIGIN_MODULE,
            "--dir",
            str(tmp_path / "origin"),
            "--ready-file",
            str(tmp_path / "origin.json"),
        ),
        tmp_path / "origin.json",
        tmp_path / "logs",
    )
    agent = await infra.start_agent("n1", 4 * SIZE, tmp_path)
    try:
        origin_url = str((await wait_ready(origin, 60))["url"])
        agent_url = str((await wait_ready(agent, 60))["url"])
        async with aiohttp.ClientSession() as session:

            async def report() -> dict[str, Any]:
                doc = await infra.get_json(session, agent_url + "/v1/fleet/caches")
                reports, paths = infra.parse_reports(doc)
                return {"reports": reports, "paths": paths}

            async def ready() -> bool:
                r = (await report())["reports"].get("c1")
                return r is not None and r.usable and r.bytes_done == SIZE

            body = {"caches": [{"cache": "c1", "uri": f"{origin_url}/files/m-v1.bin"}]}
            await infra.put_json(session, agent_url + "/v1/fleet/assignments", body)
            await _until("filled", ready)
            path = Path((await report())["paths"]["c1"])
            assert sum(p.stat().st_size for p in path.rglob("*.bin")) == SIZE

            shutil.rmtree(path)  # the node's cache is deleted behind the agent's back
            seen_unusable = False

            async def refilled() -> bool:
                nonlocal seen_unusable
                r = (await report())["reports"].get("c1")
                seen_unusable = seen_unusable or r is None or not r.usable
                return seen_unusable and r is not None and r.usable

            await _until("noticed and refilled", refilled)
            assert path.is_dir()

            await infra.put_json(session, agent_url + "/v1/fleet/assignments", {"caches": []})

            async def evicted() -> bool:
                return not path.exists() and not (await report())["reports"]

            await _until("evicted once unassigned", evicted)
    finally:
        await stop_all([agent, origin])
    assert agent.proc.returncode is not None
    assert origin.proc.returncode is not None
