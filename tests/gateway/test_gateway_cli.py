"""`warmfleet serve --config` end to end: serves, reloads on SIGHUP, stops on SIGTERM."""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import typer
import yaml
from gateway_process_support import GatewayProcess, ThreadedGateway
from gateway_support import MODEL, gateway_doc, gateway_file
from typer.testing import CliRunner

from support.waiting import wait_until_sync
from warmfleet.gateway import cli as gateway_cli

BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()


def _post(url: str) -> tuple[int, str]:
    split = urlsplit(url)
    assert split.hostname is not None
    conn = http.client.HTTPConnection(split.hostname, split.port, timeout=30)
    try:
        conn.request("POST", "/v1/chat/completions", body=BODY)
        resp = conn.getresponse()
        resp.read()
        return resp.status, resp.getheader("x-warmfleet-instance", "")
    finally:
        conn.close()


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(doc))


@pytest.mark.e2e
def test_serve_sighup_reload_and_sigterm(tmp_path: Path) -> None:
    with ThreadedGateway(None, ["a", "b"]) as fleet:
        doc = gateway_doc(fleet.backends)
        path = gateway_file(tmp_path, doc)
        with GatewayProcess(path) as gw:
            assert {_post(gw.url)[1] for _ in range(4)} == {"a", "b"}

            variant = doc["spec"]["endpoints"][0]["variants"][0]
            variant["instances"] = variant["instances"][1:]
            variant["routing"] = {"strategy": {"type": "prefix_affinity"}}
            _write(path, doc)
            gw.signal(signal.SIGHUP)
            wait_until_sync(lambda: all(_post(gw.url) == (200, "b") for _ in range(4)))

            variant["routing"] = {"strategy": {"type": "no_such_strategy"}}
            _write(path, doc)
            gw.signal(signal.SIGHUP)
            wait_until_sync(lambda: "rejected" in gw.stderr())
            assert "routing.strategy" in gw.stderr()  # the field is named
            assert _post(gw.url) == (200, "b")  # the old config stays

            gw.signal(signal.SIGTERM)
            assert gw.proc is not None
            assert gw.proc.wait(20) == 0


def test_serve_check_validates_without_serving(tmp_path: Path) -> None:
    """``serve --check``: exit 0 with a summary for a document that would start (routers built,
    discovery sources named); 2 with the field named for an invalid one, and for one that
    validates but cannot start (its tokenizer cannot be loaded)."""
    app = typer.Typer()
    gateway_cli.register(app)
    doc = gateway_doc([], strategy={"type": "prefix_affinity"})
    doc["spec"]["endpoints"][0]["variants"][0]["instances"] = [
        {"id": "a", "url": "http://127.0.0.1:9"}
    ]
    doc["spec"]["endpoints"][0]["variants"].append(
        {
            "name": "k8s",
            "weight": 0.5,
            "discovery": {"type": "kubernetes", "service": "llama-k8s", "namespace": "prod"},
        }
    )
    path = tmp_path / "gateway.yaml"
    _write(path, doc)
    result = CliRunner().invoke(app, ["--config", str(path), "--check"])
    assert result.exit_code == 0, result.output
    assert "main/v1: prefix_affinity, weight 1, 1 static instance(s)" in result.output
    assert "main/k8s: random, weight 0.5, instances from the EndpointSlices of Service prod/" in (
        result.output
    )

    doc["spec"]["endpoints"][0]["variants"][0]["routing"]["key"] = {"mode": "tokens"}
    _write(path, doc)
    result = CliRunner().invoke(app, ["--config", str(path), "--check"])
    assert result.exit_code == 2
    assert "tokenizerPath: required when routing.key.mode is 'tokens'" in result.output
    assert "endpoints.0.variants.0" in result.output

    doc["spec"]["tokenizerPath"] = str(tmp_path / "no-such-tokenizer")  # valid, cannot load
    _write(path, doc)
    result = CliRunner().invoke(app, ["--config", str(path), "--check"])
    assert result.exit_code == 2
    assert "spec.tokenizerPath" in result.output


def _stream(url: str) -> bytes:
    split = urlsplit(url)
    assert split.hostname is not None
    conn = http.client.HTTPConnection(split.hostname, split.port, timeout=30)
    try:
        body = json.loads(BODY)
        body["stream"] = True
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode())
        return conn.getresponse().read()
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.e2e
def test_sighup_during_the_graceful_stop_does_not_kill_the_gateway(tmp_path: Path) -> None:
    """Regression: the SIGHUP handler was removed before the graceful stop, so a SIGHUP then
    (a config reloader racing a rolling update) killed the process and cut the requests it
    was finishing."""
    with ThreadedGateway(None, ["a"]) as fleet:
        backend = fleet.backends[0]
        loop = fleet._loop
        assert loop is not None
        gate = asyncio.Event()
        backend.gate = gate  # the stream stalls after its first chunk until released
        doc = gateway_doc(fleet.backends)
        path = gateway_file(tmp_path, doc)
        with GatewayProcess(path) as gw, ThreadPoolExecutor(1) as pool:
            stream = pool.submit(_stream, gw.url)
            wait_until_sync(lambda: backend.stats.streams_started == 1)
            gw.signal(signal.SIGTERM)  # stop: the stream in progress gets up to 5 s
            time.sleep(0.3)
            gw.signal(signal.SIGHUP)
            time.sleep(0.3)
            loop.call_soon_threadsafe(gate.set)
            assert stream.result(20).endswith(b"data: [DONE]\n\n")
            assert gw.proc is not None
            assert gw.proc.wait(20) == 0


def test_serve_check_reads_a_discovery_file_that_is_there(tmp_path: Path) -> None:
    """A discovery file ``serve`` would reject fails ``--check`` in one line naming it; one that
    is there is counted; one not there yet is said so (the gateway waits for it)."""
    app = typer.Typer()
    gateway_cli.register(app)
    listing = tmp_path / "instances.yaml"
    doc = gateway_doc([])
    doc["spec"]["endpoints"][0]["variants"][0].pop("instances", None)
    doc["spec"]["endpoints"][0]["variants"][0]["discovery"] = {"type": "file", "path": str(listing)}
    path = tmp_path / "gateway.yaml"
    _write(path, doc)

    def check() -> tuple[int, str]:
        result = CliRunner().invoke(app, ["--config", str(path), "--check"])
        return result.exit_code, result.output

    code, out = check()
    assert code == 0, out
    assert "not there yet" in out
    _write(listing, {"instances": [{"id": "a", "url": "http://127.0.0.1:9"}]})
    code, out = check()
    assert code == 0, out
    assert f"1 instance(s) from {listing}" in out
    for bad in ("instances: [", "\xff\xfe", None):
        if bad is None:
            listing.unlink()
            listing.mkdir()
        else:
            listing.write_bytes(bad.encode("latin-1"))
        code, out = check()
        assert code == 2, out
        assert str(listing) in out
        assert len(out.strip().splitlines()) == 1, out
