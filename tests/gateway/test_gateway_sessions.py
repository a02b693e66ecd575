"""Session affinity across live gateway replicas (issue 22, item 3), with stub backends: turns
carrying ``x-warmfleet-session`` that reach random replicas land on one instance (the peers
learn the session's instance from the replica-sync notes, or without sync compute it with
``sessionPlacement: hash``), and the session moves when its instance is past the load bound;
a session header too long is refused naming it."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
from gateway_support import MODEL, FakeBackend, backends_running, gateway_doc, gateway_running
from replica_sync_support import endpoint, stub_doc, sync_ports

from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.server import StartedApp

INSTANCE, REASON = "x-warmfleet-instance", "x-warmfleet-reason"


@asynccontextmanager
async def _replicas(backends: list[FakeBackend], count: int) -> AsyncIterator[list[StartedApp]]:
    ports = sync_ports(count)
    async with AsyncExitStack() as stack:
        apps = []
        for i, port in enumerate(ports):
            sync = {
                "replicaId": f"r{i}",
                "listen": {"port": port},
                "peers": {"type": "static", "endpoints": [endpoint(p) for p in ports if p != port]},
            }
            doc = stub_doc(backends, sync, "prefix_affinity")
            apps.append(await stack.enter_async_context(gateway_running(parse_gateway_config(doc))))
        yield apps


def _body(turn: int, rng: random.Random, stream: bool = False) -> dict[str, Any]:
    """A prompt sharing nothing with the other turns: only the session ties them."""
    words = " ".join(f"w{rng.randrange(1 << 30)}" for _ in range(80))
    content = f"turn {turn}: {words}"
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "stream": stream}


async def _wait_ready(session: aiohttp.ClientSession, apps: list[StartedApp]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    for app in apps:
        while True:
            async with session.get(app.url + "/ready") as resp:
                if resp.status == 200:
                    break
            assert loop.time() < deadline, "replicas not ready in time"
            await asyncio.sleep(0.05)


async def test_a_sessions_turns_reach_random_replicas_and_land_on_one_instance() -> None:
    rng = random.Random(5)
    async with (
        backends_running("b0", "b1", "b2", "b3") as backends,
        _replicas(backends, 3) as apps,
        aiohttp.ClientSession() as session,
    ):
        await _wait_ready(session, apps)
        landed: dict[str, list[tuple[str, str, int]]] = {}
        for turn in range(24):
            name = f"conversation-{turn % 3}"
            replica = rng.randrange(3)
            headers = {"x-warmfleet-session": name}
            url = apps[replica].url + "/v1/chat/completions"
            async with session.post(url, json=_body(turn, rng), headers=headers) as resp:
                assert resp.status == 200
                landed.setdefault(name, []).append(
                    (resp.headers[INSTANCE], resp.headers[REASON], replica)
                )
            await asyncio.sleep(0.03)  # the note reaches the peers (batched every 5 ms)
        for name, turns in landed.items():
            assert len({instance for instance, _, _ in turns}) == 1, (name, turns)
            assert all(reason == "session" for _, reason, _ in turns[1:]), (name, turns)
            assert len({replica for _, _, replica in turns}) >= 2, (name, turns)
        # an agent's own header names the session too; one too long is refused, named
        url = apps[0].url + "/v1/chat/completions"
        claude = {"x-claude-code-session-id": "conversation-0"}
        async with session.post(url, json=_body(99, rng), headers=claude) as resp:
            assert resp.headers[REASON] == "session"
            assert resp.headers[INSTANCE] == landed["conversation-0"][0][0]
        too_long = {"x-warmfleet-session": "s" * 257}
        async with session.post(url, json=_body(100, rng), headers=too_long) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["param"] == "x-warmfleet-session"


async def test_unsynced_replicas_placing_sessions_by_hash_agree_on_each_home() -> None:
    """Three replicas without replica sync, ``sessionPlacement: hash``: none hears of the
    others' sessions, yet every turn of a conversation, whichever replica it reaches, lands on
    one instance (the first of the session's hash order among the least loaded); the
    conversations spread over the instances."""
    rng = random.Random(8)
    strategy = {"type": "prefix_affinity", "sessionPlacement": "hash"}
    async with backends_running("b0", "b1", "b2", "b3") as backends, AsyncExitStack() as stack:
        apps = []
        for _ in range(3):
            doc = gateway_doc(backends, strategy=strategy)
            apps.append(await stack.enter_async_context(gateway_running(parse_gateway_config(doc))))
        session = await stack.enter_async_context(aiohttp.ClientSession())
        await _wait_ready(session, apps)
        landed: dict[str, list[tuple[str, int]]] = {}
        for turn in range(48):
            name, replica = f"conversation-{turn % 12}", rng.randrange(3)
            headers = {"x-warmfleet-session": name}
            url = apps[replica].url + "/v1/chat/completions"
            async with session.post(url, json=_body(turn, rng), headers=headers) as resp:
                assert resp.status == 200
                landed.setdefault(name, []).append((resp.headers[INSTANCE], replica))
        for name, turns in landed.items():
            assert len({instance for instance, _ in turns}) == 1, (name, turns)
        assert sum(len({r for _, r in turns}) >= 2 for turns in landed.values()) >= 10
        assert len({turns[0][0] for turns in landed.values()}) >= 3


async def test_a_session_moves_off_an_instance_past_the_load_bound() -> None:
    """Streams of one session held open: the home takes them until its in-flight work is past
    the bound (at most (1 + epsilon) x the mean, here 2x), then one goes elsewhere (routed as
    any request) and the session lives there."""
    rng = random.Random(6)
    headers = {"x-warmfleet-session": "agent-program"}
    async with (
        backends_running("b0", "b1", "b2") as backends,
        _replicas(backends, 3) as apps,
        aiohttp.ClientSession() as session,
    ):
        await _wait_ready(session, apps)
        gate = asyncio.Event()
        for backend in backends:
            backend.gate = gate
        held: list[aiohttp.ClientResponse] = []
        landed: list[tuple[str, str]] = []
        try:
            for turn in range(4):
                url = apps[rng.randrange(3)].url + "/v1/chat/completions"
                resp = await session.post(url, json=_body(turn, rng, True), headers=headers)
                held.append(resp)
                assert resp.status == 200
                landed.append((resp.headers[INSTANCE], resp.headers[REASON]))
                await asyncio.sleep(0.05)
        finally:
            gate.set()
            for resp in held:
                await resp.read()
                resp.release()
        home = landed[0][0]
        moved = next(i for i, (instance, _) in enumerate(landed) if instance != home)
        assert moved >= 2, landed
        assert all(turn == (home, "session") for turn in landed[1:moved]), landed
        assert landed[moved][1] != "session", landed
        moved_to = landed[-1][0]
        assert all(turn == (moved_to, "session") for turn in landed[moved + 1 :]), landed
        await asyncio.sleep(0.05)
        url = apps[rng.randrange(3)].url + "/v1/chat/completions"
        async with session.post(url, json=_body(9, rng), headers=headers) as resp:
            assert (resp.headers[INSTANCE], resp.headers[REASON]) == (moved_to, "session")


async def test_every_route_and_the_body_worker_carry_the_session() -> None:
    """One gateway: a big body (keyed on the body worker), a small one, a completions body, a
    native invocation and a body whose ``prompt_cache_key`` names the session all go to the
    session's instance."""
    rng = random.Random(7)
    headers = {"x-warmfleet-session": "program-1"}
    async with backends_running("b0", "b1", "b2", "b3") as backends:
        doc = gateway_doc(
            backends, strategy={"type": "prefix_affinity"}, limits={"offloadBodyBytes": 4096}
        )
        async with gateway_running(parse_gateway_config(doc)) as gw, aiohttp.ClientSession() as s:
            chat_url = gw.url + "/v1/chat/completions"
            landed = []
            for size in (80, 1200, 80):  # 1,200 words: over 4 kB, keyed on the body worker
                body = _body(size, rng)
                body["messages"][0]["content"] += " pad" * size
                async with s.post(chat_url, json=body, headers=headers) as resp:
                    landed.append((resp.headers[INSTANCE], resp.headers[REASON]))
            completions = {"model": MODEL, "prompt": f"other {rng.random()}", "max_tokens": 4}
            async with s.post(gw.url + "/v1/completions", json=completions, headers=headers) as r:
                landed.append((r.headers[INSTANCE], r.headers[REASON]))
            native = f"native {rng.random()}".encode()
            url = gw.url + "/endpoints/main/invocations"
            async with s.post(url, data=native, headers=headers) as resp:
                landed.append((resp.headers[INSTANCE], resp.headers[REASON]))
            home = landed[0][0]
            assert landed[1:] == [(home, "session")] * 4, landed
            # prompt_cache_key alone: its own session (and tenant), kept like any other
            keyed = []
            for turn in range(3):
                body = {**_body(turn, rng), "prompt_cache_key": "tenant-session"}
                async with s.post(chat_url, json=body) as resp:
                    keyed.append((resp.headers[INSTANCE], resp.headers[REASON]))
            assert keyed[1:] == [(keyed[0][0], "session")] * 2, keyed
