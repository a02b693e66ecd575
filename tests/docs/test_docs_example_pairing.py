"""examples/gateway.yaml and `warmfleet emulate` pair with one documented command each (issue
21): the command written at the top of the example starts, in one emulator process, exactly the
instances the example lists, on their ports, serving the model name its variants list; the
example routes with ``prefix_affinity``.

The live test runs both commands as the example says, with every port moved by the same offset
onto free ports (the example's own 8001-8007 and 8080 may be busy on a shared machine)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
import yaml
from docs_support import EXAMPLES

from warmfleet.bench.live_fleet import consecutive_free_ports
from warmfleet.bench.live_procs import ProcessSet, free_port, wait_ready

GATEWAY_EXAMPLE = EXAMPLES / "gateway.yaml"


def _emulate_command() -> list[str]:
    """The one ``warmfleet emulate`` command of the example's header comment, as argv."""
    lines = [
        line.lstrip("#").strip()
        for line in GATEWAY_EXAMPLE.read_text(encoding="utf-8").splitlines()
        if line.startswith("#") and line.lstrip("#").strip().startswith("warmfleet emulate")
    ]
    assert len(lines) == 1, f"examples/gateway.yaml: one `warmfleet emulate` command, got {lines}"
    return shlex.split(lines[0])


def _flag(argv: list[str], name: str) -> str:
    assert argv.count(name) == 1, f"{name} in {argv}"
    return argv[argv.index(name) + 1]


def _variants(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for e in doc["spec"]["endpoints"] for v in e["variants"]]


def _example() -> dict[str, Any]:
    doc = yaml.safe_load(GATEWAY_EXAMPLE.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def test_example_instances_are_the_emulators_instances() -> None:
    argv = _emulate_command()
    base, count = int(_flag(argv, "--base-port")), int(_flag(argv, "--instances"))
    model = _flag(argv, "--model")
    ports = set()
    for variant in _variants(_example()):
        assert "discovery" not in variant, "every live instance is listed, served by the emulator"
        assert variant.get("models", [model]) == [model], variant["name"]
        for instance in variant["instances"]:
            url = urlsplit(instance["url"])
            assert url.hostname == "127.0.0.1", instance
            ports.add(url.port)
    assert ports == set(range(base, base + count)), "the example's ports = the emulator's"


def test_examples_route_with_prefix_affinity() -> None:
    """The main variants route with the product's strategy (``random`` stays the default)."""
    strategies = [v["routing"]["strategy"]["type"] for v in _variants(_example())]
    assert strategies.count("prefix_affinity") >= 2, strategies
    fleet = yaml.safe_load((EXAMPLES / "fleet.yaml").read_text(encoding="utf-8"))
    for endpoint in fleet["spec"]["endpoints"]:
        for variant in endpoint["spec"]["variants"]:
            assert variant["routing"]["strategy"]["type"] == "prefix_affinity"


def _shifted(doc: dict[str, Any], offset: int, listen_port: int) -> dict[str, Any]:
    """The example with every instance port moved by ``offset`` and its own listen port."""
    doc["spec"]["listen"]["port"] = listen_port
    for variant in _variants(doc):
        for instance in variant["instances"]:
            url = urlsplit(instance["url"])
            instance["url"] = f"{url.scheme}://{url.hostname}:{(url.port or 0) + offset}"
    return doc


@pytest.mark.slow
@pytest.mark.e2e
async def test_documented_commands_serve_a_chat(tmp_path: Path) -> None:
    argv = _emulate_command()
    count = int(_flag(argv, "--instances"))
    model = _flag(argv, "--model")
    base = consecutive_free_ports(count)
    offset = base - int(_flag(argv, "--base-port"))
    argv[argv.index("--base-port") + 1] = str(base)
    port = free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump(_shifted(_example(), offset, port)), encoding="utf-8")
    warmfleet = [sys.executable, "-c", "from warmfleet.cli import main; main()"]  # the script
    procs = ProcessSet(tmp_path / "logs")
    try:
        emulator = procs.start("emulate", [*warmfleet, *argv[1:]])
        for i in range(count):
            await wait_ready(f"http://127.0.0.1:{base + i}/health", emulator, 60.0)
        gateway = procs.start("serve", [*warmfleet, "serve", "--config", str(config)])
        url = f"http://127.0.0.1:{port}"
        await wait_ready(url + "/ready", gateway, 60.0)
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for _ in range(4):  # both variants of the default endpoint may take some
                async with session.post(url + "/v1/chat/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    answer = await resp.json()
                    assert answer["model"] == model
            native = url + "/endpoints/native/invocations"
            async with session.post(native, json=body) as resp:
                assert resp.status == 200, await resp.text()
        log = gateway.log_tail(200) + emulator.log_tail(200)
        assert "old spelling" not in log
    finally:
        procs.stop_all()
