"""The routers compared by `make bench-peers`, each started as a child process on 127.0.0.1.

- ``direct``: no router; the load generator round-robins over the instances itself.
- ``aiohttp-passthrough``: the issue's reference point, a bare aiohttp + uvloop proxy with no
  routing logic (``warmfleet.bench.passthrough``); overhead points only.
- ``protocol-passthrough``: the same on uvloop protocols + httptools, the layer the gateway is
  built on (``warmfleet.bench.protocol_passthrough``): what merely relaying HTTP in Python costs
  here, so a router's own logic is what it adds above this; overhead points only.
- ``warmfleet``: our gateway (``warmfleet serve``), one variant with the given strategy.
- ``sglang-router`` 0.3.2 and ``vllm-router`` 0.1.17 (Rust, from PyPI, each in its own venv),
  bound to 127.0.0.1 with their Prometheus listeners on 127.0.0.1 too, and ``HF_ENDPOINT``
  pointing at a dead loopback port so they never reach the Hugging Face hub. A router counts as
  ready once its ``/workers`` listing names every instance.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from warmfleet.bench.live_fleet import (
    FleetHandle,
    consecutive_free_ports,
    routing_for,
    start_gateway,
)
from warmfleet.bench.live_procs import (
    Child,
    ProcessError,
    ProcessSet,
    free_port,
    retry_if_port_taken,
    wait_ready,
)

PASSTHROUGH = "aiohttp-passthrough"
PROTOCOL_PASSTHROUGH = "protocol-passthrough"
# Proxies with no routing logic, measured as references on the overhead points only.
REFERENCE_PROXIES = {
    PASSTHROUGH: "warmfleet.bench.passthrough",
    PROTOCOL_PASSTHROUGH: "warmfleet.bench.protocol_passthrough",
}
# prefix_affinity with replica sync on (issue 22): the measured gateway and one peer replica
# (both in front of the same fleet) exchange their notes; the load goes to the first.
SYNCED_PREFIX_AFFINITY = "prefix_affinity+sync"
# prefix_affinity with traffic capture on (issue 26: its CPU cost per request), the capture
# file next to the gateway's document in the log directory
CAPTURED_PREFIX_AFFINITY = "prefix_affinity+capture"
# prefix_affinity with flow control on and no overload (issue 23: its CPU cost per request):
# a cap no point of the bench reaches, so every request goes through the gate and none waits
FLOWED_PREFIX_AFFINITY = "prefix_affinity+flow"
NO_OVERLOAD_FLOW = {"maxInFlightPerInstance": 4096, "enginePreset": "tiny-cpu"}
DEAD_HF_ENDPOINT = "http://127.0.0.1:1"
PEER_ENV = {"HF_ENDPOINT": DEAD_HF_ENDPOINT, "HF_HUB_DISABLE_TELEMETRY": "1", "NO_PROXY": "*"}


@dataclass(frozen=True)
class RouterSpec:
    router: str  # direct | a REFERENCE_PROXIES key | warmfleet | sglang-router | vllm-router
    policy: str

    @property
    def label(self) -> str:
        return self.router if self.router == "direct" else f"{self.router}/{self.policy}"


@dataclass(frozen=True)
class PeerPaths:
    sglang_python: Path | None
    vllm_router: Path | None

    def available(self, spec: RouterSpec) -> bool:
        if spec.router == "sglang-router":
            return self.sglang_python is not None and self.sglang_python.exists()
        if spec.router == "vllm-router":
            return self.vllm_router is not None and self.vllm_router.exists()
        return True


@dataclass(frozen=True)
class RunningRouter:
    spec: RouterSpec
    url: str | None  # None: direct
    child: Child | None
    peers: tuple[Child, ...] = ()  # replica-sync peers of a synced warmfleet gateway

    @property
    def children(self) -> tuple[Child, ...]:
        """Every process of this router (its CPU is the router's)."""
        return ((self.child,) if self.child is not None else ()) + self.peers


async def _wait_workers(url: str, fleet: FleetHandle, child: Child, timeout_s: float) -> None:
    """Poll ``/workers`` until it names every instance URL (registration is asynchronous)."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
        while time.monotonic() < deadline:
            if not child.alive():
                raise ProcessError(f"{child.name} exited early:\n{child.log_tail()}")
            try:
                async with session.get(url + "/workers") as resp:
                    text = await resp.text()
                    if resp.status == 200 and all(u in text for u in fleet.urls):
                        return
            except (aiohttp.ClientError, TimeoutError, OSError):
                pass
            await asyncio.sleep(0.2)
    raise ProcessError(f"{url}: workers not registered after {timeout_s:.0f} s\n{child.log_tail()}")


def _peer_argv(spec: RouterSpec, paths: PeerPaths, fleet: FleetHandle, port: int) -> list[str]:
    common = [
        "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *fleet.urls,
        "--policy", spec.policy, "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(free_port()),
    ]  # fmt: skip
    if spec.router == "sglang-router" and paths.sglang_python is not None:
        launch = [str(paths.sglang_python), "-m", "sglang_router.launch_router"]
        return [*launch, *common, "--log-level", "warn"]
    if spec.router == "vllm-router" and paths.vllm_router is not None:
        return [str(paths.vllm_router), *common, "--log-level", "warning"]
    raise ProcessError(f"{spec.label}: router not installed (run `make peers-venvs`)")


async def start_router(
    procs: ProcessSet,
    spec: RouterSpec,
    paths: PeerPaths,
    fleet: FleetHandle,
    timeout_s: float = 90.0,
) -> RunningRouter:
    """Start (and wait for) one router in front of ``fleet``; direct starts nothing."""
    if spec.router == "direct":
        return RunningRouter(spec, None, None)
    name = spec.label.replace("/", "-")
    if spec.router == "warmfleet" and spec.policy == SYNCED_PREFIX_AFFINITY:
        return await _start_synced(procs, spec, fleet, name)
    if spec.router == "warmfleet" and spec.policy == CAPTURED_PREFIX_AFFINITY:
        capture = {
            "capture": {"path": f"{name}.capture.jsonl", "maxBytes": 64 << 20, "keepFiles": 1}
        }
        routing = routing_for("prefix_affinity")
        gateway = await start_gateway(procs, fleet, routing, name=name, extra_spec=capture)
        return RunningRouter(spec, gateway.url, gateway.child)
    if spec.router == "warmfleet" and spec.policy == FLOWED_PREFIX_AFFINITY:
        routing = {**routing_for("prefix_affinity"), "flow": dict(NO_OVERLOAD_FLOW)}
        gateway = await start_gateway(procs, fleet, routing, name=name)
        return RunningRouter(spec, gateway.url, gateway.child)
    if spec.router == "warmfleet":
        gateway = await start_gateway(procs, fleet, routing_for(spec.policy), name=name)
        return RunningRouter(spec, gateway.url, gateway.child)
    module = REFERENCE_PROXIES.get(spec.router)

    def argv(port: int) -> list[str]:
        if module is not None:
            return [sys.executable, "-m", module, "--port", str(port), *fleet.urls]
        return _peer_argv(spec, paths, fleet, port)

    env = PEER_ENV if module is None else None

    async def launch() -> tuple[str, Child]:
        port = free_port()
        child = procs.start(name, argv(port), env=env)
        url = f"http://127.0.0.1:{port}"
        await wait_ready(url + "/health", child, timeout_s)
        return url, child

    url, child = await retry_if_port_taken(procs, launch)
    if module is None:  # the peers register their workers asynchronously
        await _wait_workers(url, fleet, child, timeout_s)
    return RunningRouter(spec, url, child)


def replica_sync_sections(sync_ports: Sequence[int]) -> list[dict[str, Any]]:
    """``spec.replicaSync`` of each replica on loopback (its PUB socket on ``sync_ports[i]``,
    catch-up on the next port), every other replica its static peer."""
    endpoints = [f"tcp://127.0.0.1:{port}" for port in sync_ports]
    return [
        {
            "replicaId": f"bench-replica-{i}",
            "listen": {"host": "127.0.0.1", "port": port},
            "peers": {"type": "static", "endpoints": endpoints[:i] + endpoints[i + 1 :]},
            "catchUpTimeoutS": 5.0,
        }
        for i, port in enumerate(sync_ports)
    ]


async def _start_synced(
    procs: ProcessSet, spec: RouterSpec, fleet: FleetHandle, name: str
) -> RunningRouter:
    """Two gateway replicas with replica sync, started together (each catches up from the
    other before it is ready); the first one is measured, the second applies its notes."""
    base = consecutive_free_ports(4)  # two replicas: a PUB and a catch-up port each
    sections = replica_sync_sections([base, base + 2])
    routing = routing_for(spec.policy.split("+", 1)[0])
    first, peer = await asyncio.gather(
        *(
            start_gateway(procs, fleet, routing, name=f"{name}-{i}", extra_spec={"replicaSync": s})
            for i, s in enumerate(sections)
        )
    )
    return RunningRouter(spec, first.url, first.child, (peer.child,))
