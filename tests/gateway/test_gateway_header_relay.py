"""The instance's response headers clients read (request id, rate limits, processing time,
retry hints) reach the client, whole answers and streams alike; hop-by-hop and other headers
do not, and the gateway's own (instance, routing reason) stay."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import openai
from aiohttp import web
from gateway_support import MODEL, FakeBackend, gateway_config, gateway_running

# What the backend sets on every answer; RELAYED must reach the client.
RELAYED = {
    "x-request-id": "req-123",
    "x-ratelimit-remaining-requests": "99",
    "x-ratelimit-reset-tokens": "6ms",
    "openai-processing-ms": "42",
    "retry-after-ms": "10",
}
# Hop-by-hop (keep-alive) and unlisted headers stay between the gateway and the instance.
HEADERS = {**RELAYED, "keep-alive": "timeout=5", "x-internal-secret": "s"}


class HeaderBackend(FakeBackend):
    def _app(self) -> web.Application:
        app = super()._app()

        async def add_headers(_request: web.Request, response: web.StreamResponse) -> None:
            response.headers.update(HEADERS)
            if response.content_type == "text/event-stream":  # another, on streams only
                response.headers["server-timing"] = "engine;dur=3"

        app.on_response_prepare.append(add_headers)
        return app


async def _answer(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[dict[str, str], bytes]:
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        return {k.lower(): v for k, v in resp.headers.items()}, await resp.read()


async def test_instance_headers_are_relayed_whole_and_streamed() -> None:
    backend = HeaderBackend("a", chunks=3)
    await backend.start()
    try:
        async with (
            gateway_running(gateway_config([backend])) as gw,
            aiohttp.ClientSession() as session,
        ):
            chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            whole, body = await _answer(session, gw.url, chat)
            assert json.loads(body)["object"] == "chat.completion"
            streamed, raw = await _answer(session, gw.url, {**chat, "stream": True})
            assert raw.endswith(b"data: [DONE]\n\n")
            for headers in (whole, streamed):
                assert {name: headers.get(name) for name in RELAYED} == RELAYED
                assert headers["x-warmfleet-instance"] == "a"
                assert headers["x-warmfleet-reason"] == "round_robin"
                assert "x-internal-secret" not in headers
                assert "keep-alive" not in headers
            assert streamed["server-timing"] == "engine;dur=3"
            assert streamed["transfer-encoding"] == "chunked"
            assert streamed["cache-control"] == "no-cache"
    finally:
        await backend.stop()


async def test_the_openai_client_sees_the_request_id() -> None:
    backend = HeaderBackend("a")
    await backend.start()
    try:
        async with (
            gateway_running(gateway_config([backend])) as gw,
            openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0) as client,
        ):
            chat = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}]
            )
            assert chat._request_id == "req-123"
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}]
            )
            assert raw.headers["x-ratelimit-remaining-requests"] == "99"
            assert raw.headers["openai-processing-ms"] == "42"
    finally:
        await backend.stop()
