"""The embedded node agent as a real child process against the real origin process: assignment,
fill, a deleted cache noticed and refilled, unassignment evicting the data."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.fleet_acceptance import ENDPOINT, endpoint_spec
from warmfleet.api.resources import ModelSource
from warmfleet.control.actions import NodeCacheAssignment
from warmfleet.local import infra
from warmfleet.local.config import LocalFleet, origin_file
from warmfleet.local.fleet import EmbeddedFleet
from warmfleet.local.origin_proc import generate_model
from warmfleet.local.procs import module_argv, start_child, stop_all, wait_ready

SIZE = 3_000_000
TOKEN = "fleet-token"


async def _until(what: str, check: Callable[[], Any], timeout_s: float = 30.0) -> None:
    for _ in range(int(timeout_s / 0.1)):
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out: {what}")


@pytest.mark.slow
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
    agent = await infra.start_agent("n1", 4 * SIZE, tmp_path, TOKEN)
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
            await infra.put_assignments(session, agent_url, body, TOKEN)
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

            await infra.put_assignments(session, agent_url, {"caches": []}, TOKEN)

            async def evicted() -> bool:
                return not path.exists() and not (await report())["reports"]

            await _until("evicted once unassigned", evicted)
    finally:
        await stop_all([agent, origin])
    assert agent.proc.returncode is not None
    assert origin.proc.returncode is not None


@pytest.mark.slow
async def test_agent_takes_the_fleets_token_not_the_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$WARMFLEET_AGENT_TOKEN`` set in the user's shell (inherited by the agent) must not
    lock the fleet out: the agent requires the token the fleet gave it, and only that one."""
    monkeypatch.setenv("WARMFLEET_AGENT_TOKEN", "the-users-own")
    agent = await infra.start_agent("n1", SIZE, tmp_path, TOKEN)
    try:
        agent_url = str((await wait_ready(agent, 60))["url"])
        url = agent_url + "/v1/fleet/assignments"
        async with aiohttp.ClientSession() as session:
            for token in (None, "the-users-own", "wrong"):
                with pytest.raises(aiohttp.ClientResponseError) as refused:
                    await infra.put_json(session, url, {"caches": []}, token)
                assert refused.value.status == 401
            auth = {"Authorization": f"Bearer {TOKEN}"}
            bad_bodies: list[object] = [[], {"caches": [1]}, {"caches": "x"}, {"caches": [{}]}]
            for bad in bad_bodies:
                async with session.put(url, json=bad, headers=auth) as resp:
                    assert resp.status == 400  # was a 500
            await infra.put_assignments(session, agent_url, {"caches": []}, TOKEN)
            # a prefetch that fails in the background must not take the agent down
            headers = {"Authorization": f"Bearer {TOKEN}"}
            body = {"uri": "http://127.0.0.1:1/unreachable.bin"}
            async with session.post(f"{agent_url}/v1/prefetch", json=body, headers=headers) as r:
                assert r.status == 202
            await asyncio.sleep(1.0)
            assert agent.alive
            assert (await infra.get_json(session, agent_url + "/healthz"))["ok"] is True
    finally:
        await stop_all([agent])


@pytest.mark.slow
async def test_the_fleet_assigns_with_its_own_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``warmfleet up`` with ``$WARMFLEET_AGENT_TOKEN`` in the user's shell: the fleet's
    assignments reach its agents (they were refused with 401 and dropped) and get filled."""
    monkeypatch.setenv("WARMFLEET_AGENT_TOKEN", "the-users-own")
    spec = {
        "workdir": str(tmp_path),
        "nodes": [{"name": "n1", "budget": 4 * SIZE}],
        "origin": {"models": [{"name": ENDPOINT, "size": SIZE, "revisions": ["v1"]}]},
        "gateway": {"port": 0},  # the endpoint is never reconciled: no replica starts
        "endpoints": [{"name": ENDPOINT, "spec": endpoint_spec("v1", "none", 1)}],
    }
    config = LocalFleet.model_validate({"spec": spec})
    async with EmbeddedFleet(config) as fleet:
        assert fleet.agent_token != EmbeddedFleet(config).agent_token  # one per fleet
        await wait_ready(fleet.agents["n1"], 60)
        source = ModelSource(uri=f"origin://{ENDPOINT}", revision="v1")
        fleet.assignments = {"n1": (NodeCacheAssignment("c1", source, ""),)}

        async def filled() -> bool:
            await fleet._observe_agents()
            await fleet._push_assignments()
            report = fleet.world.nodes["n1"].weights.get("c1")
            return report is not None and report.usable and report.bytes_done == SIZE

        await _until("assigned and filled", filled)
