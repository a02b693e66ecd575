"""The fleet's CURVE key from a Kubernetes Secret (``spec.replicaSync.curveSecret``) against
kmock's API emulator: the first replica makes the Secret, every other one reads the same key,
two that start together agree, and whatever stops a replica from getting the key fails its
start naming the field (never a replica that syncs without authentication)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import aiohttp
import pytest
from gateway_support import MODEL, backends_running
from replica_sync_support import hears, stub_pair, sync_ports, sync_section

from support.waiting import wait_until
from warmfleet.core.errors import ConfigError
from warmfleet.gateway.replica_sync.config import ReplicaSyncConfig
from warmfleet.gateway.replica_sync.curve import CurveKey, new_secret
from warmfleet.gateway.replica_sync.curve_secret import fleet_curve_key
from warmfleet.kube.access import KubeAccessError

NS = "serving"
SECRETS = f"/api/v1/namespaces/{NS}/secrets"


def declare(kmock: Any) -> None:
    kmock.resources["v1/secrets"] = kmock.ResourceInfo(
        kind="Secret", namespaced=True, verbs=["get", "list", "create", "delete"]
    )


def ref(api: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": "gw-sync",
        "namespace": NS,
        "apiServer": api,
        "tokenPath": "/nonexistent/token",
        "caPath": "/nonexistent/ca.crt",
        "timeoutS": 2.0,
        **fields,
    }


def config(api: str, **fields: Any) -> ReplicaSyncConfig:
    return ReplicaSyncConfig.model_validate({"curveSecret": ref(api, **fields)})


def secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": encoded}


async def test_the_first_replica_makes_the_secret_and_the_others_read_it(
    kmock: Any, session: aiohttp.ClientSession
) -> None:
    declare(kmock)
    api = str(kmock.url).rstrip("/")
    first = await fleet_curve_key(config(api))
    assert isinstance(first, CurveKey)
    async with session.get(f"{api}{SECRETS}/gw-sync") as resp:
        made = await resp.json()
    assert made["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "warmfleet"
    stored = base64.b64decode(made["data"]["curve-secret"]).decode()
    assert CurveKey.from_secret(stored, "stored") == first
    assert await fleet_curve_key(config(api)) == first
    assert await fleet_curve_key(config(api, create=False)) == first


async def test_replicas_starting_together_agree_on_one_key(kmock: Any) -> None:
    declare(kmock)
    api = str(kmock.url).rstrip("/")
    keys = await asyncio.gather(*(fleet_curve_key(config(api)) for _ in range(4)))
    assert len(set(keys)) == 1
    assert keys[0] is not None


async def test_an_existing_secret_is_used_as_it_is(
    kmock: Any, session: aiohttp.ClientSession
) -> None:
    declare(kmock)
    api = str(kmock.url).rstrip("/")
    given = new_secret()
    await session.post(api + SECRETS, json=secret("mine", {"fleet-key": given}))
    key = await fleet_curve_key(config(api, name="mine", key="fleet-key"))
    assert key == CurveKey.from_secret(given, "given")


@pytest.mark.parametrize(
    ("stored", "fields", "error", "message"),
    [
        (
            None,
            {"create": False},
            KubeAccessError,
            r"Secret serving/gw-sync not found \(create is false\)",
        ),
        (
            {"other": new_secret()},
            {},
            KubeAccessError,
            r"Secret gw-sync has no entry 'curve-secret'",
        ),
        (
            {"curve-secret": "not a key"},
            {},
            ConfigError,
            r"Secret serving/gw-sync 'curve-secret': not a CURVE",
        ),
    ],
    ids=["missing", "no-entry", "not-a-key"],
)
async def test_a_key_it_cannot_get_fails_the_start_naming_the_field(
    kmock: Any,
    session: aiohttp.ClientSession,
    stored: dict[str, str] | None,
    fields: dict[str, Any],
    error: type[Exception],
    message: str,
) -> None:
    """What the API server refused is a ``KubeAccessError``, a stored value that is no key a
    ``ConfigError``: both name the field."""
    declare(kmock)
    api = str(kmock.url).rstrip("/")
    if stored is not None:
        await session.post(api + SECRETS, json=secret("gw-sync", stored))
    with pytest.raises(error, match=rf"^spec\.replicaSync\.curveSecret: .*{message}"):
        await fleet_curve_key(config(api, **fields))


async def test_an_unreachable_api_fails_the_start_naming_the_field(unused_tcp_port: int) -> None:
    with pytest.raises(KubeAccessError, match=r"^spec\.replicaSync\.curveSecret: "):
        await fleet_curve_key(config(f"http://127.0.0.1:{unused_tcp_port}"))


def test_one_key_source_at_most() -> None:
    both = {"curveSecret": {"name": "gw-sync"}, "curveSecretEnv": "KEY"}
    with pytest.raises(ValueError, match="curveSecret, curveSecretEnv: set at most one"):
        ReplicaSyncConfig.model_validate(both)
    with pytest.raises(ValueError, match="name"):
        ReplicaSyncConfig.model_validate({"curveSecret": {"name": "Not_A_Name"}})


async def test_gateways_sharing_the_secret_sync_with_curve_on(kmock: Any) -> None:
    """Two gateways given the same Secret: the first makes it, both hold its key, both say
    ``curve``, and they hear each other (a CURVE handshake only succeeds with the same key)."""
    declare(kmock)
    api = str(kmock.url).rstrip("/")
    port_a, port_b = sync_ports(2)

    def section(name: str, port: int, peer: int) -> dict[str, Any]:
        return sync_section(name, port, [peer], catch_up_timeout_s=2.0, curve_secret=ref(api))

    async with (
        backends_running("b0") as backends,
        stub_pair(backends, section("a", port_a, port_b), section("b", port_b, port_a)) as (a, b),
    ):
        sync_a, sync_b = a.gateway.replica_sync, b.gateway.replica_sync
        assert sync_a is not None
        assert sync_b is not None
        assert sync_a.describe()["curve"]
        assert sync_b.describe()["curve"]
        await wait_until(lambda: hears(sync_b, sync_a))  # its CURVE handshake is through
        async with aiohttp.ClientSession() as http:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi " * 50}]}
            async with http.post(a.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
        await wait_until(lambda: sync_b.metrics.received.value > 0)
