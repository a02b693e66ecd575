"""The node agent's mutating routes need the bearer token (or a loopback-only listener);
read-only routes stay open. Everything listens on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cache_support import agent_config, spec_for, wait_for

from harness.origin import Blob, Origin
from warmfleet.agent.api_auth import ApiAuth, bearer_matches, is_loopback, read_agent_token
from warmfleet.agent.manager import CacheManager
from warmfleet.agent.node_agent import NodeAgent
from warmfleet.agent.sourceset import SourceSet
from warmfleet.agent.status_api import build_app
from warmfleet.agent.store import Store
from warmfleet.cache.config import StatusSpec
from warmfleet.core.errors import ConfigError

TOKEN = "s3cr3t-agent-token"


@contextlib.asynccontextmanager
async def _agent(root: Path, status: str = "") -> AsyncIterator[str]:
    agent = NodeAgent(agent_config(root, f"  reconcileIntervalS: 30\n{status}"))
    run = asyncio.create_task(agent.run())

    async def listening() -> bool:
        return agent.port != 0

    await wait_for(listening)
    try:
        yield f"http://127.0.0.1:{agent.port}"
    finally:
        agent.stop_event.set()
        await asyncio.wait_for(run, 10)


async def _call(http: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> int:
    async with http.request(method, url, **kw) as resp:
        await resp.read()
        return resp.status


async def test_mutating_routes_need_the_token(
    origin: tuple[Origin, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    org, url = origin
    org.put("w.bin", Blob(data=b"w" * 5000))
    monkeypatch.setenv("WARMFLEET_AGENT_TOKEN", TOKEN)
    body = {"uri": f"{url}/files/w.bin", "name": "w", "holder": "ctl"}
    async with _agent(tmp_path) as api, aiohttp.ClientSession() as http:
        assert await _call(http, "POST", f"{api}/v1/prefetch", json=body) == 401
        wrong = {"Authorization": "Bearer nope"}
        assert await _call(http, "POST", f"{api}/v1/prefetch", json=body, headers=wrong) == 401
        basic = {"Authorization": f"Basic {TOKEN}"}
        assert await _call(http, "POST", f"{api}/v1/prefetch", json=body, headers=basic) == 401
        assert not org.requests  # nothing was fetched for the refused requests
        good = {"Authorization": f"Bearer {TOKEN}"}
        assert await _call(http, "POST", f"{api}/v1/prefetch", json=body, headers=good) == 202

        async def ready() -> bool:
            async with http.get(f"{api}/v1/artifacts/w") as resp:
                return resp.status == 200 and (await resp.json())["state"] == "ready"

        await wait_for(ready)
        refs = f"{api}/v1/artifacts/w/refs/intruder"
        assert await _call(http, "POST", refs) == 401
        assert await _call(http, "DELETE", f"{api}/v1/artifacts/w/refs/ctl") == 401
        assert await _call(http, "POST", refs, headers=good) == 200
        for path in ("/healthz", "/v1/status", "/v1/artifacts/w", "/metrics"):
            assert await _call(http, "GET", api + path) == 200  # read-only stays open


async def test_token_from_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WARMFLEET_AGENT_TOKEN", raising=False)
    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN}\n")
    status = f"  status: {{host: 127.0.0.1, port: 0, tokenFile: {token_file}}}\n"
    async with _agent(tmp_path / "root", status) as api, aiohttp.ClientSession() as http:
        body = {"uri": "/nonexistent", "name": "x"}
        assert await _call(http, "POST", f"{api}/v1/prefetch", json=body) == 401
        good = {"Authorization": f"Bearer {TOKEN}"}
        assert await _call(http, "POST", f"{api}/v1/prefetch", json=body, headers=good) == 202


async def test_non_loopback_listener_without_token_refuses_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Configured for 0.0.0.0 with no token (served on 127.0.0.1 here): changes are refused."""
    monkeypatch.delenv("WARMFLEET_AGENT_TOKEN", raising=False)
    spec = spec_for(tmp_path).model_copy(update={"status": StatusSpec(host="0.0.0.0")})
    async with SourceSet(spec.sources, spec.download) as sources:
        manager = CacheManager(Store(tmp_path), spec, sources)
        spawned: list[Any] = []

        def spawn(coro: Any) -> Any:
            spawned.append(coro)
            coro.close()
            return None

        async def embedder(_: web.Request) -> web.Response:  # a route an embedding adds
            return web.json_response({})

        app = build_app(manager, spawn)
        app.router.add_put("/v1/embedder", embedder)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        api = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with aiohttp.ClientSession() as http:
                body = {"uri": "/etc", "name": "x"}
                async with http.post(f"{api}/v1/prefetch", json=body) as resp:
                    assert resp.status == 403
                    assert "no token is configured" in (await resp.json())["error"]
                assert await _call(http, "PUT", f"{api}/v1/embedder") == 403
                assert await _call(http, "GET", f"{api}/v1/status") == 200
        finally:
            await runner.cleanup()
        assert not spawned


def test_token_and_listener_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WARMFLEET_AGENT_TOKEN", raising=False)
    assert [is_loopback(h) for h in ("127.0.0.1", "127.9.9.9", "::1", "localhost")] == [True] * 4
    assert [is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "node-1", "")] == [False] * 5
    assert ApiAuth(None, "127.0.0.1").mutations_open
    assert not ApiAuth(TOKEN, "127.0.0.1").mutations_open  # a token always applies
    assert not ApiAuth(None, "0.0.0.0").mutations_open
    with pytest.raises(ConfigError, match=r"status\.tokenFile"):
        read_agent_token(StatusSpec(token_file=str(tmp_path / "missing")))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match=r"status\.tokenFile"):
        read_agent_token(StatusSpec(token_file=str(tmp_path / "empty")))
    monkeypatch.setenv("MY_AGENT_TOKEN", " t1 ")
    assert read_agent_token(StatusSpec(token_env="MY_AGENT_TOKEN")) == "t1"


@pytest.mark.parametrize("header", ["Bearer \udcff", f"Bearer {TOKEN}\udce9", "\udcff"])
def test_a_header_that_is_not_utf8_is_a_wrong_token(header: str) -> None:
    """aiohttp hands non-UTF-8 header bytes over as lone surrogates: ``.encode()`` raised (a
    500, on the status API and on the peer route alike)."""
    assert not bearer_matches(header, TOKEN)
    assert bearer_matches(f"Bearer {TOKEN}", TOKEN)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "JSON"),
        (b'{"uri": "/x", "pin": "false"}', "'pin'"),  # bool("false") pinned it for ever
        (b'{"uri": "/x", "holder": 5}', "'holder'"),
        (b'{"uri": 1}', "'uri'"),
        (b"[]", "'uri'"),
    ],
)
async def test_a_prefetch_body_of_the_wrong_shape_is_a_400(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: bytes, named: str
) -> None:
    monkeypatch.delenv("WARMFLEET_AGENT_TOKEN", raising=False)
    async with _agent(tmp_path) as api, aiohttp.ClientSession() as http:
        headers = {"Content-Type": "application/json"}
        async with http.post(f"{api}/v1/prefetch", data=body, headers=headers) as resp:
            assert resp.status == 400
            assert named in (await resp.json())["error"]
