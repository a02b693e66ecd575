"""Against a token-auth registry on 127.0.0.1 (an aiohttp app): the bearer-token flow (tokens
are scoped to one repository and expire, as on Docker Hub, GHCR or Harbor) and image indexes
that do not pin their platform manifest."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from cache_support import manager_for

from harness.origin import ServerThread
from warmfleet.agent.oci import OCI_INDEX, OCI_MANIFEST
from warmfleet.agent.sources.base import SourceError
from warmfleet.cache.state import ArtifactState


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class TokenRegistry:
    """``/token?scope=repository:<repo>:pull`` issues a token good for ``token_uses``
    authorised requests to that repository only; ranged blob GETs are served."""

    token_uses: int = 1000
    blobs: dict[str, bytes] = field(default_factory=dict)
    manifests: dict[tuple[str, str], bytes] = field(default_factory=dict)
    uses_left: dict[str, int] = field(default_factory=dict)  # token -> remaining requests
    scope_of: dict[str, str] = field(default_factory=dict)  # token -> repository
    issued: int = 0
    port: int = 0

    def push(self, repo: str, tag: str, layer_bytes: int) -> str:
        config = json.dumps({"architecture": "amd64", "os": "linux"}).encode()
        layer = os.urandom(layer_bytes)
        for blob in (config, layer):
            self.blobs[_digest(blob)] = blob
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "c", "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": "l", "digest": _digest(layer), "size": len(layer)}],
        }
        body = json.dumps(manifest).encode()
        self.manifests[(repo, tag)] = body
        return _digest(body)

    def push_index(self, repo: str, tag: str, child: dict[str, object]) -> None:
        """An image index whose linux/amd64 entry is the descriptor ``child``."""
        entry = {
            "mediaType": OCI_INDEX,
            **child,
            "platform": {"os": "linux", "architecture": "amd64"},
        }
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry]}
        self.manifests[(repo, tag)] = json.dumps(index).encode()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/token", self._token)
        app.router.add_get(r"/v2/{repo:.+}/manifests/{ref}", self._manifest)
        app.router.add_get(r"/v2/{repo:.+}/blobs/{digest}", self._blob)
        return app

    async def _token(self, request: web.Request) -> web.Response:
        scope = request.query.get("scope", "")
        repo = scope.removeprefix("repository:").removesuffix(":pull")
        self.issued += 1
        token = f"t{self.issued}"
        self.uses_left[token] = self.token_uses
        self.scope_of[token] = repo
        return web.json_response({"token": token})

    def _authorise(self, request: web.Request, repo: str) -> None:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if self.scope_of.get(token) != repo or self.uses_left.get(token, 0) <= 0:
            realm = f"http://127.0.0.1:{request.url.port}/token"
            challenge = f'Bearer realm="{realm}",service="reg",scope="repository:{repo}:pull"'
            raise web.HTTPUnauthorized(headers={"WWW-Authenticate": challenge})
        self.uses_left[token] -= 1

    async def _manifest(self, request: web.Request) -> web.Response:
        repo = request.match_info["repo"]
        self._authorise(request, repo)
        ref = request.match_info["ref"]
        body = self.manifests.get((repo, ref)) or next(
            b for b in self.manifests.values() if _digest(b) == ref
        )
        headers = {"Docker-Content-Digest": _digest(body), "Content-Type": OCI_MANIFEST}
        return web.Response(body=body, headers=headers)

    async def _blob(self, request: web.Request) -> web.Response:
        self._authorise(request, request.match_info["repo"])
        data = self.blobs[request.match_info["digest"]]
        rng = request.headers.get("Range")
        if not rng:
            return web.Response(body=data)
        first, _, last = rng.removeprefix("bytes=").partition("-")
        start, end = int(first), int(last) + 1
        headers = {"Content-Range": f"bytes {start}-{end - 1}/{len(data)}"}
        return web.Response(status=206, body=data[start:end], headers=headers)


@pytest.fixture
def token_registry() -> Iterator[tuple[TokenRegistry, str]]:
    reg = TokenRegistry()
    with ServerThread(reg.app) as server:
        yield reg, f"127.0.0.1:{server.port}"


async def test_two_repositories_of_one_registry_each_get_their_own_token(
    token_registry: tuple[TokenRegistry, str], tmp_path: Path
) -> None:
    reg, addr = token_registry
    first = reg.push("team/a", "v1", 10_000)
    second = reg.push("team/b", "v1", 10_000)
    async with manager_for(tmp_path) as m:
        rec_a = await m.prefetch(f"oci://{addr}/team/a:v1")
        rec_b = await m.prefetch(f"oci://{addr}/team/b:v1")  # a's token is not valid for b
        assert (rec_a.extra["digest"], rec_b.extra["digest"]) == (first, second)
        assert rec_b.state == ArtifactState.READY


async def test_token_expiring_mid_download_is_renewed(
    token_registry: tuple[TokenRegistry, str], tmp_path: Path
) -> None:
    reg, addr = token_registry
    reg.token_uses = 3  # the manifest and two chunks, then the token is dead
    digest = reg.push("team/big", "v1", 1_000_000)
    async with manager_for(tmp_path, chunk=64 * 1024, concurrency=1) as m:
        rec = await m.prefetch(f"oci://{addr}/team/big:v1")
        assert rec.extra["digest"] == digest
        assert rec.state == ArtifactState.READY
        status = m.status_of(rec.key)
        assert status is not None
        assert status.retries == 0  # renewed in place, not a failed attempt
    assert reg.issued > 2


async def test_index_entry_that_names_a_tag_not_a_digest_is_refused(
    token_registry: tuple[TokenRegistry, str], tmp_path: Path
) -> None:
    reg, addr = token_registry
    reg.push("team/app", "unpinned", 10_000)
    body = reg.manifests[("team/app", "unpinned")]
    reg.push_index(
        "team/app", "v1", {"mediaType": OCI_MANIFEST, "digest": "unpinned", "size": len(body)}
    )
    async with manager_for(tmp_path) as m:
        with pytest.raises(SourceError, match="sha256"):  # a tag can change under the index
            await m.prefetch(f"oci://{addr}/team/app:v1")
    assert not any((tmp_path / "objects").iterdir())


async def test_index_pointing_at_another_index_is_refused(
    token_registry: tuple[TokenRegistry, str], tmp_path: Path
) -> None:
    reg, addr = token_registry
    digest = reg.push("team/app", "img", 10_000)
    reg.push_index(
        "team/app", "inner", {"digest": digest, "size": len(reg.manifests[("team/app", "img")])}
    )
    inner = reg.manifests[("team/app", "inner")]
    reg.push_index(
        "team/app", "outer", {"mediaType": OCI_INDEX, "digest": _digest(inner), "size": len(inner)}
    )
    async with manager_for(tmp_path) as m:
        with pytest.raises(SourceError, match="not the image manifest"):
            await m.prefetch(f"oci://{addr}/team/app:outer")
