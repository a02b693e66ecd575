"""Issue 26's privacy test: prompts and a tenant carrying marker strings go through a gateway
capturing to a file, against the emulator; the file holds no marker, no unsalted hash of the
prompts' blocks or of the tenant, and the hashes it holds are the deployment-salted ones."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import aiohttp
import xxhash
from gateway_support import gateway_running

from warmfleet.api.trace_format import parse_trace
from warmfleet.core.hashing import chain_seed
from warmfleet.core.types import RoutingKey
from warmfleet.emulator.config import build_spec
from warmfleet.emulator.fleet import EmulatedFleet
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.parse import parse_chat
from warmfleet.routing.router import Router

MODEL = "warmfleet-emulated"
SALT = "deployment-secret-1"
TENANT_HEADER = "x-prefix-aware-id"
MARKERS = ("ZEBRA-MARKER-7731", "kumquat-sentinel-4410", "Ünïcode-märker-99")
TENANT = "tenant-MARKER-5512"
SESSION = "session-MARKER-8820"
ROUTING = {"strategy": {"type": "prefix_affinity"}, "key": {"salt": SALT}}


def body(i: int, stream: bool) -> dict[str, Any]:
    marker = MARKERS[i % len(MARKERS)]
    text = f"system prompt of {marker} " * 20 + f"question {i} about {marker}"
    chat: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 4,
    }
    if stream:
        chat |= {"stream": True, "stream_options": {"include_usage": True}}
    return chat


def doc(urls: list[str], path: Path) -> dict[str, Any]:
    variant = {
        "name": "v1",
        "models": [MODEL],
        "routing": ROUTING,
        "instances": [{"id": f"emu-{i}", "url": url} for i, url in enumerate(urls)],
    }
    spec = {
        "health": {"intervalS": 0.2, "timeoutS": 0.2},
        "endpoints": [{"name": "main", "variants": [variant]}],
        "capture": {"path": str(path)},
    }
    return {"apiVersion": "warmfleet.dev/v1alpha1", "kind": "Gateway", "spec": spec}


def key_under(salt: str | None, chat: dict[str, Any], tenant: str | None) -> RoutingKey:
    """The key of ``chat`` (in session ``SESSION``) with ``salt`` as the salt."""
    routing = dict(ROUTING, key={"salt": salt} if salt is not None else {})
    router = Router(RoutingConfig.model_validate(routing), random.Random(0))
    return router.key(parse_chat(chat, tenant, TENANT_HEADER, SESSION))


def hashes_under(salt: str | None, chat: dict[str, Any], tenant: str | None) -> set[int]:
    """The key's block hashes, prefix hash and session hash with ``salt`` as the salt."""
    key = key_under(salt, chat, tenant)
    return {*key.block_hashes, key.prefix_hash, key.session or 0}


async def test_no_marker_nor_unsalted_hash_in_the_capture(tmp_path: Path) -> None:
    path = tmp_path / "capture.jsonl"
    spec = build_spec(instances=2, preset="tiny-cpu", block_size=16, speedup=50.0)
    bodies = [body(i, stream=i % 2 == 1) for i in range(12)]
    async with EmulatedFleet(spec) as fleet:
        config = parse_gateway_config(doc(fleet.urls, path))
        async with gateway_running(config) as gw, aiohttp.ClientSession() as client:
            for chat in bodies:
                headers = {TENANT_HEADER: TENANT, "x-warmfleet-session": SESSION}
                url = gw.url + "/v1/chat/completions"
                async with client.post(url, json=chat, headers=headers) as resp:
                    assert resp.status == 200
                    await resp.read()
    raw = path.read_text(encoding="utf-8")
    trace = parse_trace(raw.splitlines(), str(path))
    assert len(trace.records) == len(bodies)
    lowered = raw.lower()
    for marker in (*MARKERS, TENANT, SESSION, "system prompt", "question"):
        assert marker.lower() not in lowered
        assert json.dumps(marker)[1:-1].lower() not in lowered  # nor JSON-escaped
    written = {h for r in trace.records for h in r.hash_ids}
    written_text = set(re.findall(r"[0-9a-f]{16}|\d{6,}", raw))
    for i, chat in enumerate(bodies):
        salted = hashes_under(SALT, chat, TENANT)
        assert set(trace.records[i].hash_ids) <= salted
        assert trace.records[i].session == f"{key_under(SALT, chat, TENANT).session:016x}"
        assert trace.records[i].hash_ids
        for other in (None, "", "warmfleet"):  # the default salt is public
            for tenant in (TENANT, None):
                unsalted = hashes_under(other, chat, tenant)
                assert not unsalted & written
                assert not {str(h) for h in unsalted} & written_text
                assert not {f"{h:016x}" for h in unsalted} & written_text
    tenants = {r.tenant for r in trace.records}
    assert len(tenants) == 1
    assert None not in tenants
    for salt in ("", "warmfleet", SALT):  # not a plain hash of the tenant under any salt
        for seed in (0, chain_seed(salt)):
            assert xxhash.xxh3_64_hexdigest(TENANT.encode(), seed) not in tenants
    streamed = [r for i, r in enumerate(trace.records) if i % 2 == 1]
    assert all(r.output_length == 4 for r in trace.records)  # usage, streamed or not
    assert any(r.engine_cached_tokens for r in trace.records)
    assert all(r.engine_cached_tokens is not None for r in streamed)
