"""``KubeClient.update``: a read-modify-write carries the resourceVersion it read; a 409 (the
object changed meanwhile) leads to a new read and a new patch, a bounded number of times."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from warmfleet.kube import client as kube

PATH = "/apis/apps/v1/namespaces/ns/deployments/d"


class Server:
    """One Deployment; another writer bumps it after each of the first ``races`` reads."""

    def __init__(self, races: int) -> None:
        self.version = 1
        self.races = races
        self.labels: dict[str, str] = {"other": "x"}
        self.patches: list[dict[str, Any]] = []

    def obj(self) -> dict[str, Any]:
        meta = {"name": "d", "resourceVersion": str(self.version), "labels": dict(self.labels)}
        return {"metadata": meta}

    async def get(self, _request: web.Request) -> web.Response:
        body = self.obj()
        if self.races > 0:  # what the client holds is now one version behind
            self.races -= 1
            self.version += 1
        return web.json_response(body)

    async def patch(self, request: web.Request) -> web.Response:
        patch = json.loads(await request.text())
        self.patches.append(patch)
        if patch["metadata"].get("resourceVersion") != str(self.version):
            return web.json_response({"reason": "Conflict"}, status=409)
        self.labels.update(patch["metadata"].get("labels") or {})
        self.version += 1
        return web.json_response(self.obj())


async def run(server: Server) -> tuple[kube.KubeClient, dict[str, Any] | None]:
    app = web.Application()
    app.router.add_get(PATH, server.get)
    app.router.add_patch(PATH, server.patch)
    async with TestServer(app, host="127.0.0.1") as test_server, aiohttp.ClientSession() as http:
        client = kube.KubeClient(http, str(test_server.make_url("")))

        def change(current: dict[str, Any]) -> dict[str, Any]:
            return {"metadata": {"labels": {"mine": current["metadata"]["resourceVersion"]}}}

        try:
            return client, await client.update(kube.DEPLOYMENTS, "ns", "d", change)
        except kube.KubeError as err:
            if err.status != 409:
                raise
            return client, None


async def test_a_conflict_is_read_again_and_retried() -> None:
    server = Server(races=1)
    client, result = await run(server)
    assert result is not None
    assert client.conflicts_retried == 1
    assert [p["metadata"]["resourceVersion"] for p in server.patches] == ["1", "2"]
    assert server.labels == {"other": "x", "mine": "2"}  # computed from the fresh read


@pytest.mark.parametrize("races", [kube.CONFLICT_ATTEMPTS])
async def test_conflicts_are_bounded(races: int) -> None:
    server = Server(races=races)
    client, result = await run(server)
    assert result is None  # the last 409 is raised
    assert len(server.patches) == kube.CONFLICT_ATTEMPTS
    assert client.conflicts_retried == kube.CONFLICT_ATTEMPTS - 1
