"""``ownership.patch_as_read``: a patch to an object the pass read (a Deployment's replicas, a
status) goes only to that object (its uid) and, when told, only while its endpoint controls it,
checked on the version patched: the patch carries the resourceVersion of the read it was
checked on (not the pass's, which a status write would find stale whenever anything else
touched the object), the API server refuses it (409) if the object changed since, and then
the check runs again; what is not that object any more is left to the next pass."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kmock_cluster import endpoint_body

from warmfleet.api import names
from warmfleet.api.resources import InferenceEndpointSpec
from warmfleet.control.observed import DesiredEndpoint
from warmfleet.kube import client as kube
from warmfleet.operator import ownership, render

PATH = "/apis/apps/v1/namespaces/ns/deployments/d"
Obj = dict[str, Any]


class Server:
    """One Deployment, versioned as an API server versions it; ``bumps``: another writer
    changes it after each of that many reads."""

    def __init__(self, owner_uid: str = "uid-llama", bumps: int = 0) -> None:
        owner = render.owner_reference(names.ENDPOINT_KIND, "llama", owner_uid)
        self.meta: Obj = {"name": "d", "uid": "u1", "ownerReferences": [owner]}
        self.version = 7
        self.bumps = bumps
        self.patches: list[tuple[str, Obj]] = []

    async def get(self, _request: web.Request) -> web.Response:
        body = {"metadata": {**self.meta, "resourceVersion": str(self.version)}}
        if self.bumps > 0:
            self.bumps -= 1
            self.version += 1
        return web.json_response(body)

    async def patch(self, request: web.Request) -> web.Response:
        body = json.loads(await request.text())
        self.patches.append((request.path, body))
        if body["metadata"]["resourceVersion"] != str(self.version):
            return web.json_response({"reason": "Conflict"}, status=409)
        self.version += 1
        return web.json_response({"metadata": self.meta})


@pytest.fixture
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Server, kube.KubeClient]]:
    server = Server(**getattr(request, "param", {}))
    app = web.Application()
    app.router.add_get(PATH, server.get)
    app.router.add_patch(PATH, server.patch)
    app.router.add_patch(f"{PATH}/status", server.patch)
    async with TestServer(app, host="127.0.0.1") as test_server, aiohttp.ClientSession() as http:
        yield server, kube.KubeClient(http, str(test_server.make_url("")))


def _read(uid: str = "u1") -> Obj:
    return {"metadata": {"name": "d", "uid": uid, "resourceVersion": "3"}}  # the pass's read


LLAMA = DesiredEndpoint(
    "llama", InferenceEndpointSpec.model_validate(endpoint_body("llama")["spec"]), "uid-llama"
)
SCALE = {"spec": {"replicas": 1}}


async def test_the_patch_carries_the_version_it_was_checked_on(
    served: tuple[Server, kube.KubeClient],
) -> None:
    server, client = served
    status = {"status": {"phase": "Ready"}}
    assert await ownership.patch_as_read(
        client, kube.DEPLOYMENTS, "ns", _read(), status, sub="status"
    )
    owned = (names.DEPLOYMENT, LLAMA)
    assert await ownership.patch_as_read(
        client, kube.DEPLOYMENTS, "ns", _read(), SCALE, owner=owned
    )
    assert server.patches == [
        (f"{PATH}/status", {**status, "metadata": {"resourceVersion": "7"}}),
        (PATH, {**SCALE, "metadata": {"resourceVersion": "8"}}),
    ]


@pytest.mark.parametrize("served", [{"owner_uid": "uid-old"}], indirect=True)
async def test_an_object_its_endpoint_does_not_control_is_not_patched(
    served: tuple[Server, kube.KubeClient], caplog: pytest.LogCaptureFixture
) -> None:
    server, client = served
    owned = (names.DEPLOYMENT, LLAMA)
    with caplog.at_level(logging.WARNING, logger="warmfleet.operator"):
        done = await ownership.patch_as_read(
            client, kube.DEPLOYMENTS, "ns", _read(), SCALE, owner=owned
        )
    assert not done
    assert server.patches == []
    assert caplog.messages == [
        "InferenceEndpoint llama: Deployment d belongs to an earlier InferenceEndpoint llama"
        " (uid uid-old): left alone"
    ]


@pytest.mark.parametrize(
    ("served", "read", "patches"),
    [({}, _read("u0"), 0), ({"bumps": kube.CONFLICT_ATTEMPTS}, _read(), kube.CONFLICT_ATTEMPTS)],
    ids=["made-again", "changing"],
    indirect=["served"],
)
async def test_an_object_not_as_read_is_left_for_the_next_pass(
    served: tuple[Server, kube.KubeClient],
    read: Obj,
    patches: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, client = served
    with caplog.at_level(logging.INFO, logger="warmfleet.operator"):
        done = await ownership.patch_as_read(client, kube.DEPLOYMENTS, "ns", read, SCALE)
    assert not done  # and no error: the pass goes on
    assert len(server.patches) == patches  # a 409 is read again, a bounded number of times
    said = "deployments d changed since it was read: not patched, read again next pass"
    assert caplog.messages[-1].startswith(said)
