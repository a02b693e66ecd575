"""Registry manifests are untrusted input: a body over ``sources.registry_max_manifest_bytes``
is refused while it streams in (never read whole), and deeply nested JSON is refused with a
clear error, not a RecursionError. Against a small registry on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from cache_support import manager_for

from harness.origin import ServerThread
from warmfleet.agent.bounded_json import (
    DocumentTooDeepError,
    DocumentTooLargeError,
    check_json_depth,
)
from warmfleet.agent.oci import OCI_MANIFEST
from warmfleet.agent.sources.base import TransientSourceError
from warmfleet.cache.config import SourcesSpec
from warmfleet.core.config import parse_document
from warmfleet.core.errors import ConfigError

KIB = 1024
LIMIT_BYTES = 64 * KIB


@dataclass
class Registry:
    """``/v2/<repo>/manifests/<ref>``: ``big`` streams ``big_bytes`` of JSON without a
    Content-Length (counting what it managed to send), ``sized`` declares a large
    Content-Length, ``deep`` is a small but 200,000-deep document."""

    big_bytes: int = 64 << 20
    sent_bytes: int = 0
    bodies: dict[str, bytes] = field(default_factory=dict)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(r"/v2/{repo:.+}/manifests/{ref}", self._manifest)
        return app

    async def _manifest(self, request: web.Request) -> web.StreamResponse:
        ref = request.match_info["ref"]
        if ref == "slow":
            return await self._trickle(request)
        if ref != "big":
            body = self.bodies[ref]
            return web.Response(body=body, content_type=OCI_MANIFEST)
        resp = web.StreamResponse(headers={"Content-Type": OCI_MANIFEST})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        block = b'{"pad": "' + b"x" * (64 * KIB) + b'"}'
        try:
            while self.sent_bytes < self.big_bytes:
                await resp.write(block)
                self.sent_bytes += len(block)
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the client went away: what was sent is counted
        return resp

    async def _trickle(self, request: web.Request) -> web.StreamResponse:
        """A small manifest, one byte every 50 ms (sock_read never times out)."""
        body = json.dumps({"mediaType": OCI_MANIFEST, "pad": "z" * 2000}).encode()
        resp = web.StreamResponse(headers={"Content-Type": OCI_MANIFEST})
        resp.content_length = len(body)
        await resp.prepare(request)
        try:
            for i in range(len(body)):
                await resp.write(body[i : i + 1])
                await asyncio.sleep(0.05)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return resp


@pytest.fixture
def registry() -> Iterator[tuple[Registry, str]]:
    reg = Registry()
    deep = b'{"a":' * 200_000 + b"1" + b"}" * 200_000
    reg.bodies = {
        "deep": deep,
        "deeplist": b"[" * 200_000 + b"]" * 200_000,
        "sized": json.dumps({"mediaType": OCI_MANIFEST, "pad": "y" * 200 * KIB}).encode(),
    }
    with ServerThread(reg.app) as server:
        yield reg, f"127.0.0.1:{server.port}"


async def test_manifest_over_the_limit_is_refused_while_streaming(
    registry: tuple[Registry, str], tmp_path: Path
) -> None:
    reg, addr = registry
    sources = SourcesSpec(registry_max_manifest_bytes=LIMIT_BYTES)
    async with manager_for(tmp_path, sources=sources) as m:
        with pytest.raises(DocumentTooLargeError, match="larger than the limit of 65536"):
            await m.resolve(f"oci://{addr}/demo/app:big")
        with pytest.raises(DocumentTooLargeError, match="204"):  # from Content-Length
            await m.resolve(f"oci://{addr}/demo/app:sized")
    await asyncio.sleep(0.2)
    # the client stopped reading right after the limit: the origin could not push the 64 MiB
    assert reg.sent_bytes < 16 << 20, reg.sent_bytes
    assert not m.records()  # refused at resolve: nothing admitted


@pytest.mark.parametrize("ref", ["deep", "deeplist"])
async def test_deeply_nested_manifest_is_a_clear_error(
    registry: tuple[Registry, str], tmp_path: Path, ref: str
) -> None:
    _, addr = registry
    async with manager_for(tmp_path) as m:  # the default limit (4 MiB) lets it in
        with pytest.raises(DocumentTooDeepError, match="nested deeper than 32 levels"):
            await m.resolve(f"oci://{addr}/demo/app:{ref}")


async def test_trickling_manifest_is_cut_at_the_request_timeout(
    registry: tuple[Registry, str], tmp_path: Path
) -> None:
    _, addr = registry
    async with manager_for(tmp_path, request_timeout_s=0.5) as m:
        with pytest.raises(TransientSourceError, match=r"no complete answer within 0\.5 s"):
            await asyncio.wait_for(m.resolve(f"oci://{addr}/demo/app:slow"), 10)


def test_depth_check_counts_brackets_outside_strings_only() -> None:
    ok = json.dumps({"a": [{"b": "[[[[{{{{" * 1000}], "c": '\\"]]'}).encode()
    check_json_depth(ok, "doc")
    nested = b"[" * 32 + b"]" * 32
    check_json_depth(nested, "doc")
    with pytest.raises(DocumentTooDeepError):
        check_json_depth(b"[" + nested + b"]", "doc")
    with pytest.raises(DocumentTooDeepError):
        check_json_depth(b'{"a": [}', "doc")  # unbalanced


def test_manifest_limit_is_a_typed_size() -> None:
    assert SourcesSpec().registry_max_manifest_bytes == 4 * 2**20
    assert SourcesSpec(registry_max_manifest_bytes="1MiB").registry_max_manifest_bytes == 2**20
    with pytest.raises(ConfigError, match="registryMaxManifestBytes"):
        parse_document(SourcesSpec, {"registry_max_manifest_bytes": 0})
