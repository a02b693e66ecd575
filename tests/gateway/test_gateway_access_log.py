"""The access log (``spec.access_log``): off by default, one line per answered request when on,
switched by a config reload."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

import aiohttp
import pytest
import yaml
from gateway_support import (
    MODEL,
    backends_running,
    gateway_config,
    gateway_doc,
    gateway_running,
)

from support.waiting import wait_until
from warmfleet.gateway.config import load_gateway_config, parse_gateway_config

LOGGER = "warmfleet.gateway.access"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


async def test_off_by_default(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with (
        backends_running("a") as backends,
        gateway_running(gateway_config(backends)) as gw,
        aiohttp.ClientSession() as client,
        client.post(gw.url + "/v1/chat/completions", json=CHAT) as resp,
    ):
        assert resp.status == 200
    assert gw.app.server.access_log is None
    assert lines(caplog) == []


async def test_one_line_per_request_with_instance_reason_and_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with backends_running("a", chunks=20, chunk_delay_s=0.05) as backends:
        doc = gateway_doc(backends)
        doc["spec"]["access_log"] = True
        async with gateway_running(parse_gateway_config(doc)) as gw:
            async with aiohttp.ClientSession() as client:
                headers = {"x-request-id": "req-1"}
                url = gw.url + "/v1/chat/completions"
                async with client.post(url, json=CHAT, headers=headers) as resp:
                    assert resp.status == 200
                async with client.post(url, data=b"{not json") as resp:
                    assert resp.status == 400
                async with client.get(gw.url + "/health") as resp:
                    assert resp.status == 200
                async with client.post(url, json={**CHAT, "stream": True}) as resp:
                    await resp.content.readany()  # the first chunk, then leave
            await wait_until(lambda: len(lines(caplog)) == 4)
    ok, bad, health, left = lines(caplog)
    assert ok.startswith("POST /v1/chat/completions 200 ")
    assert "instance=a reason=round_robin" in ok
    assert f"bytes_in={len(json.dumps(CHAT))} " in ok  # aiohttp's json= is json.dumps
    assert ok.endswith("request_id=req-1")
    assert bad.startswith("POST /v1/chat/completions 400 ")
    assert "instance=none reason=rejected bytes_in=9 " in bad
    assert health.startswith("GET /health 200 ")
    assert "instance=- reason=-" in health
    assert left.startswith("POST /v1/chat/completions 499 ")  # the client closed mid-stream
    assert "instance=a" in left


async def test_a_reload_switches_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with backends_running("a") as backends, aiohttp.ClientSession() as client:
        path = tmp_path / "gateway.yaml"
        doc = gateway_doc(backends)
        path.write_text(yaml.safe_dump(doc))
        async with gateway_running(load_gateway_config(path), config_path=path) as gw:
            doc["spec"]["access_log"] = True
            tmp = path.with_suffix(".tmp")
            tmp.write_text(yaml.safe_dump(doc))
            os.replace(tmp, path)
            assert gw.gateway.reload() is True
            async with client.get(gw.url + "/health") as resp:
                assert resp.status == 200
            await asyncio.sleep(0)
            assert len(lines(caplog)) == 1
            doc["spec"]["access_log"] = False
            path.write_text(yaml.safe_dump(doc))
            assert gw.gateway.reload() is True
            assert gw.app.server.access_log is None


async def test_a_request_in_flight_when_it_is_switched_on_gets_no_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its start was not timed: no line with a made-up duration; the next request has one."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with backends_running("a") as backends, aiohttp.ClientSession() as client:
        gate = backends[0].gate = asyncio.Event()
        path = tmp_path / "gateway.yaml"
        doc = gateway_doc(backends)
        path.write_text(yaml.safe_dump(doc))
        async with gateway_running(load_gateway_config(path), config_path=path) as gw:
            url = gw.url + "/v1/chat/completions"
            async with client.post(url, json={**CHAT, "stream": True}) as resp:
                await resp.content.readany()  # in flight, held after its first chunk
                doc["spec"]["access_log"] = True
                path.write_text(yaml.safe_dump(doc))
                assert gw.gateway.reload() is True
                gate.set()
                await resp.read()
            async with client.post(url, json=CHAT) as resp:
                assert resp.status == 200
            await wait_until(lambda: len(lines(caplog)) == 1)
    assert lines(caplog)[0].startswith("POST /v1/chat/completions 200 ")
