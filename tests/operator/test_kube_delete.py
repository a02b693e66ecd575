"""Deletes as read: ``KubeClient.delete`` sends the uid and resourceVersion it is given as
``DeleteOptions.preconditions``; the API server refuses (409) a delete of an object that is not
that one any more, and ``ownership.delete_as_read`` leaves it for the next pass."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from warmfleet.kube import client as kube
from warmfleet.operator import ownership

PATH = "/apis/warmfleet.dev/v1alpha1/namespaces/ns/modelcaches/c"


class Server:
    """One ModelCache, and the API server's delete preconditions."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = {
            "metadata": {"name": "c", "namespace": "ns", "uid": "u2", "resourceVersion": "7"}
        }
        self.bodies: list[Any] = []

    async def delete(self, request: web.Request) -> web.Response:
        text = await request.text()
        body = json.loads(text) if text else None
        self.bodies.append(body)
        if self.obj is None:
            return web.json_response({"reason": "NotFound"}, status=404)
        meta = self.obj["metadata"]
        for key, value in ((body or {}).get("preconditions") or {}).items():
            if meta[key] != value:
                return web.json_response({"reason": "Conflict"}, status=409)
        self.obj = None
        return web.json_response({"status": "Success"})


@pytest.fixture
async def served() -> AsyncIterator[tuple[Server, kube.KubeClient]]:
    server = Server()
    app = web.Application()
    app.router.add_delete(PATH, server.delete)
    async with TestServer(app, host="127.0.0.1") as test_server, aiohttp.ClientSession() as http:
        yield server, kube.KubeClient(http, str(test_server.make_url("")))


def _read(uid: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": "c", "uid": uid, "resourceVersion": version}}


async def test_a_delete_carries_what_was_read(served: tuple[Server, kube.KubeClient]) -> None:
    server, client = served
    assert await ownership.delete_as_read(client, kube.MODEL_CACHES, "ns", _read("u2", "7"))
    assert server.obj is None
    assert server.bodies == [{"preconditions": {"uid": "u2", "resourceVersion": "7"}}]
    await client.delete(kube.MODEL_CACHES, "ns", "c", uid="u2")  # gone already: no error
    await client.delete(kube.MODEL_CACHES, "ns", "c")
    assert server.bodies[-1] is None  # nothing to check: a plain delete


@pytest.mark.parametrize(
    ("read", "version"),
    [(_read("u1", "7"), False), (_read("u2", "6"), True)],
    ids=["made-again", "changed"],
)
async def test_an_object_not_as_read_is_left_for_the_next_pass(
    served: tuple[Server, kube.KubeClient],
    read: dict[str, Any],
    version: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, client = served
    with pytest.raises(kube.KubeError) as refused:
        await client.delete(kube.MODEL_CACHES, "ns", "c", uid="u1")
    assert refused.value.status == kube.CONFLICT
    with caplog.at_level(logging.INFO, logger="warmfleet.operator"):
        done = await ownership.delete_as_read(
            client, kube.MODEL_CACHES, "ns", read, version=version
        )
    assert not done
    assert server.obj is not None
    sent = set(server.bodies[-1]["preconditions"])
    assert sent == ({"uid", "resourceVersion"} if version else {"uid"})
    assert caplog.messages[-1].startswith("modelcaches c changed since it was read")
