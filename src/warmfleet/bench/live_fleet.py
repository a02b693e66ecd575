"""An emulated fleet and a warmfleet gateway as child processes, for live benchmarks.

Both are started from documents written next to their logs (``kind: Emulator`` for
``warmfleet emulate --config``, ``kind: Gateway`` for ``warmfleet serve --config``) on ports that
were free a moment before, and are ready once every instance answers ``/health`` and the gateway
answers ``/ready``.
"""

from __future__ import annotations

import json
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from warmfleet.api.resources import API_VERSION
from warmfleet.bench.live_procs import (
    Child,
    ProcessError,
    ProcessSet,
    command_argv,
    free_port,
    retry_if_port_taken,
    wait_ready,
)
from warmfleet.bench.loadgen_metrics import MetricsTarget

MODEL = "warmfleet-emulated"
ADMIN_TOKEN_ENV = "WARMFLEET_BENCH_ADMIN_TOKEN"
ENDPOINT = "bench"
VARIANT = "main"


@dataclass(frozen=True)
class FleetHandle:
    ids: tuple[str, ...]
    urls: tuple[str, ...]
    child: Child
    model: str

    @property
    def metrics_targets(self) -> list[MetricsTarget]:
        return [MetricsTarget(i, u + "/metrics") for i, u in zip(self.ids, self.urls, strict=True)]


@dataclass(frozen=True)
class GatewayHandle:
    url: str
    child: Child
    admin_token: str


def _ports_free(base: int, count: int) -> bool:
    for port in range(base, base + count):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def consecutive_free_ports(count: int, attempts: int = 50) -> int:
    """A base port such that ``base .. base+count-1`` were all free a moment ago."""
    for _ in range(attempts):
        base = free_port()
        if base + count <= 65_535 and _ports_free(base, count):
            return base
    raise ProcessError(f"no {count} consecutive free ports on 127.0.0.1")


async def start_fleet(
    procs: ProcessSet,
    *,
    name: str,
    instances: int,
    spec: Mapping[str, Any],
    timeout_s: float = 60.0,
) -> FleetHandle:
    """``warmfleet emulate`` with ``instances`` engines; ``spec`` adds EmulatorSpec fields."""

    async def launch() -> FleetHandle:
        base = consecutive_free_ports(instances)
        fields = {
            "model": MODEL,
            **spec,
            "instances": instances,
            "host": "127.0.0.1",
            "basePort": base,
        }
        doc = {"apiVersion": API_VERSION, "kind": "Emulator", "spec": fields}
        path = procs.log_dir / f"{name}.json"
        procs.log_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
        argv = command_argv("warmfleet.emulator.cli", "emulate_command", "--config", str(path))
        child = procs.start(name, argv)
        urls = tuple(f"http://127.0.0.1:{base + i}" for i in range(instances))
        for url in urls:
            await wait_ready(url + "/health", child, timeout_s)
        ids = tuple(f"emu-{i}" for i in range(instances))
        return FleetHandle(ids, urls, child, str(fields["model"]))

    return await retry_if_port_taken(procs, launch)


def gateway_document(
    fleet: FleetHandle,
    routing: Mapping[str, Any],
    port: int,
    *,
    extra_spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    instances = [{"id": i, "url": u} for i, u in zip(fleet.ids, fleet.urls, strict=True)]
    variant = {"name": VARIANT, "routing": dict(routing), "instances": instances}
    spec: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": port},
        "admin": {"tokenEnv": ADMIN_TOKEN_ENV},
        "health": {"intervalS": 2.0, "timeoutS": 1.0},
        "endpoints": [{"name": ENDPOINT, "variants": [variant]}],
        **(extra_spec or {}),
    }
    return {"apiVersion": API_VERSION, "kind": "Gateway", "spec": spec}


async def start_gateway(
    procs: ProcessSet,
    fleet: FleetHandle,
    routing: Mapping[str, Any],
    *,
    name: str = "gateway",
    timeout_s: float = 60.0,
    extra_spec: Mapping[str, Any] | None = None,
) -> GatewayHandle:
    """``warmfleet serve`` in front of ``fleet`` with one variant routed by ``routing``
    (``extra_spec``: more fields of its ``spec``)."""
    token = secrets.token_hex(16)

    async def launch() -> GatewayHandle:
        port = free_port()
        doc = gateway_document(fleet, routing, port, extra_spec=extra_spec)
        path = procs.log_dir / f"{name}.json"
        procs.log_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
        flags = ("--config", str(path), "--log-level", "warning")
        argv = command_argv("warmfleet.gateway.cli", "serve_command", *flags)
        child = procs.start(name, argv, env={ADMIN_TOKEN_ENV: token})
        url = f"http://127.0.0.1:{port}"
        await wait_ready(url + "/ready", child, timeout_s)
        return GatewayHandle(url, child, token)

    return await retry_if_port_taken(procs, launch)


def routing_for(strategy: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A gateway ``RoutingConfig`` document: ``strategy`` on text keys."""
    return {"strategy": {"type": strategy, **(extra or {})}, "key": {"mode": "text"}}
