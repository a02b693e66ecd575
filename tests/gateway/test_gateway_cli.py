"""`warmfleet serve --config` end to end: serves, reloads on SIGHUP, stops on SIGTERM."""

from __future__ import annotations

import http.client
import json
import signal
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from gateway_support import MODEL, GatewayProcess, ThreadedGateway, gateway_doc

BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()


def _post(url: str) -> tuple[int, str]:
    split = urlsplit(url)
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


def _until(predicate: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.mark.e2e
def test_serve_sighup_reload_and_sigterm(tmp_path: Path) -> None:
    with ThreadedGateway(None, ["a", "b"]) as fleet:
        doc = gateway_doc(fleet.backends)
        doc["spec"]["listen"] = {"host": "127.0.0.1", "port": 0}
        path = tmp_path / "gateway.yaml"
        _write(path, doc)
        with GatewayProcess(path) as gw:
            assert {_post(gw.url)[1] for _ in range(4)} == {"a", "b"}

            variant = doc["spec"]["endpoints"][0]["variants"][0]
            variant["instances"] = variant["instances"][1:]
            variant["routing"] = {"strategy": {"type": "prefix_affinity"}}
            _write(path, doc)
            gw.signal(signal.SIGHUP)
            _until(lambda: all(_post(gw.url) == (200, "b") for _ in range(4)))

            variant["routing"] = {"strategy": {"type": "no_such_strategy"}}
            _write(path, doc)
            gw.signal(signal.SIGHUP)
            _until(lambda: "rejected" in gw.stderr())
            assert "routing.strategy" in gw.stderr()  # the field is named
            assert _post(gw.url) == (200, "b")  # the old config stays

            gw.signal(signal.SIGTERM)
            assert gw.proc is not None
            assert gw.proc.wait(20) == 0
