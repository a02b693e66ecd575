"""CURVE on the replicas' sync sockets (``spec.replicaSync.curveSecretEnv``): replicas holding
the fleet's key hear each other and catch up; one holding another key, or none, hears nothing
and is counted; a variable unset or not a key is refused at load, naming the field."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from gateway_support import MODEL, backends_running, gateway_running
from replica_sync_support import stub_doc, sync_ports, sync_section
from typer.testing import CliRunner

from support.waiting import wait_until
from warmfleet.api.replica_sync import BatchEncoder
from warmfleet.cli import app
from warmfleet.core.errors import ConfigError
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.replica_sync.curve import CurveKey, new_secret
from warmfleet.gateway.replica_sync.transport import AnswerBudget, Sockets, batch_message
from warmfleet.routing.replica_notes import FinishedNote

FLEET_ENV, OTHER_ENV = "WF_TEST_SYNC_KEY", "WF_TEST_OTHER_SYNC_KEY"


def _message() -> bytes:
    note = FinishedNote("peer#1", "e/v", 1, "i0", 5)
    return batch_message("peer#1", time.time(), 1, BatchEncoder().encode([note]))


async def _heard(sender: Sockets, receiver: Sockets, timeout_s: float) -> bool:
    """Whether a batch ``sender`` publishes reaches ``receiver`` within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sender.send(_message())
        await asyncio.sleep(0.02)
        if receiver.receive_ready():
            return True
    return False


def _endpoint(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


@pytest.mark.parametrize("other", ["another key", "no key"])
async def test_only_the_fleets_key_hears_and_catches_up(other: str) -> None:
    key = CurveKey.from_secret(new_secret(), "test")
    refused: list[int] = []
    port_a, port_b, port_c = sync_ports(3)
    a = Sockets(_endpoint(port_a), curve=key, on_refused=lambda: refused.append(1))
    b = Sockets(_endpoint(port_b), curve=key)
    c_key = CurveKey.from_secret(new_secret(), "test") if other == "another key" else None
    c = Sockets(_endpoint(port_c), curve=c_key)
    frames = [b"wf-sync-log", b"a#1"]
    serving = [asyncio.create_task(s.serve_zap()) for s in (a, b, c)]
    budget, dropped = AnswerBudget(time.monotonic, 4, 1.0), list[str]()
    serve = a.serve_log_requests(lambda: frames, budget, dropped.append)
    serving.append(asyncio.create_task(serve))
    try:
        b.set_peers([a.endpoint])
        c.set_peers([a.endpoint])
        assert await _heard(a, b, timeout_s=10.0)
        assert await b.fetch_log(a.endpoint, 5.0) == frames
        assert not await _heard(a, c, timeout_s=1.0)
        with pytest.raises(TimeoutError):
            await c.fetch_log(a.endpoint, 1.0)
        assert refused  # another key or none: the handshake failed
    finally:
        for task in serving:
            task.cancel()
        await asyncio.gather(*serving, return_exceptions=True)
        for s in (a, b, c):
            s.close()


async def test_gateways_sharing_the_key_sync_and_one_without_it_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A routes; B (the fleet's key) catches up from A and hears its batches; C (another key)
    learns nothing and A counts its refused handshakes."""
    monkeypatch.setenv(FLEET_ENV, new_secret())
    monkeypatch.setenv(OTHER_ENV, new_secret())
    port_a, port_b, port_c = sync_ports(3)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 50}]}

    def doc(name: str, port: int, env: str) -> object:
        peers = [p for p in (port_a, port_b, port_c) if p != port]
        section = sync_section(name, port, peers, curveSecretEnv=env, catch_up_timeout_s=2.0)
        return stub_doc(backends, section, "prefix_affinity")

    async with backends_running("b0", "b1") as backends:
        config_a = parse_gateway_config(doc("a", port_a, FLEET_ENV))
        async with gateway_running(config_a) as a, aiohttp.ClientSession() as session:
            async with session.post(a.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
            config_b = parse_gateway_config(doc("b", port_b, FLEET_ENV))
            config_c = parse_gateway_config(doc("c", port_c, OTHER_ENV))
            async with gateway_running(config_b) as b, gateway_running(config_c) as c:
                sync_a, sync_b, sync_c = (g.gateway.replica_sync for g in (a, b, c))
                assert sync_a is not None
                assert sync_b is not None
                assert sync_c is not None
                await wait_until(lambda: sync_b.caught_up and sync_c.caught_up, timeout_s=10.0)
                assert sync_b.metrics.catch_up_notes._value.get() >= 2
                await wait_until(lambda: sync_a.origin in sync_b._last_batch, timeout_s=5.0)
                await wait_until(lambda: sync_a.metrics.refused._value.get() > 0, timeout_s=5.0)
                assert sync_c.metrics.catch_up_notes._value.get() == 0
                assert sync_a.origin not in sync_c._last_batch
                assert sync_c.origin not in sync_a._last_batch
                assert sync_a.describe()["curve"] is True


def test_a_key_variable_unset_or_not_a_key_is_refused_at_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    section = sync_section("a", 20_000, [], curveSecretEnv=FLEET_ENV)
    variant = {"name": "v1", "instances": [{"id": "i0", "url": "http://127.0.0.1:9"}]}
    endpoints = [{"name": "main", "variants": [variant]}]
    doc = {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "Gateway",
        "spec": {"endpoints": endpoints, "replica_sync": section},
    }
    monkeypatch.delenv(FLEET_ENV, raising=False)
    with pytest.raises(ConfigError, match=rf"curveSecretEnv: \${FLEET_ENV} is not set"):
        parse_gateway_config(doc)
    for bad in ("", "too-short", "x" * 39 + "\u00e9", "~" * 40):
        monkeypatch.setenv(FLEET_ENV, bad)
        with pytest.raises(ConfigError, match="not a CURVE secret key") as info:
            parse_gateway_config(doc)
        if len(bad) != 40:  # the message names the command that prints one
            assert "(40 Z85 characters; `warmfleet sync-key` prints a new one)" in str(info.value)
    secret = new_secret()
    monkeypatch.setenv(FLEET_ENV, secret + "\n")  # (a file's trailing newline is fine)
    config = parse_gateway_config(doc).spec.replica_sync
    assert config is not None
    key = config.curve_key()
    assert key is not None
    assert key.secret == secret.encode()
    assert secret not in repr(key)
    bad_name = {**section, "curveSecretEnv": "NOT-A-NAME"}
    with pytest.raises(ConfigError, match="curveSecretEnv"):
        parse_gateway_config({**doc, "spec": {"endpoints": endpoints, "replica_sync": bad_name}})


def test_sync_key_prints_a_new_key_each_time() -> None:
    first, second = (CliRunner().invoke(app, ["sync-key"]) for _ in range(2))
    assert (first.exit_code, second.exit_code) == (0, 0)
    keys = [r.output.strip() for r in (first, second)]
    assert keys[0] != keys[1]
    for text in keys:
        assert CurveKey.from_secret(text, "test").secret == text.encode()
