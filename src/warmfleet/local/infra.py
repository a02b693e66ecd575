"""The fixed parts of the embedded fleet: the model origin, one agent per node, the gateway."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import aiohttp

from warmfleet.control.observed import NodeCacheReport, NodeCacheState
from warmfleet.gateway.app import create_app
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.server import StartedApp, start_app
from warmfleet.local.config import LocalFleetSpec, SyntheticModel, origin_file
from warmfleet.local.origin_proc import generate_model
from warmfleet.local.procs import (
    AGENT_TOKEN_ENV,
    Child,
    module_argv,
    start_child,
    wait_ready,
)
from warmfleet.local.replicas import instance_file, write_instances

AGENT_MODULE = "warmfleet.local.agent_proc"
ORIGIN_MODULE = "warmfleet.local.origin_proc"
_STATES = {s.value: s for s in NodeCacheState}


async def start_origin(spec: LocalFleetSpec, workdir: Path) -> tuple[Child, str]:
    models = workdir / "origin"
    models.mkdir(parents=True, exist_ok=True)  # empty when every model is a directory model
    for model in spec.origin.models:
        if not isinstance(model, SyntheticModel):
            continue  # a directory model is read where it is
        for revision in model.revisions:
            seed = f"{model.name}@{revision}"
            path, cancel = models / origin_file(model.name, revision), threading.Event()
            try:  # in a thread: SIGINT/SIGTERM stay served while a large model is written
                await asyncio.to_thread(generate_model, path, model.size, seed, cancel)
            except asyncio.CancelledError:
                cancel.set()
                raise
    ready = workdir / "run" / "origin.json"
    argv = module_argv(ORIGIN_MODULE, "--dir", str(models), "--ready-file", str(ready))
    if spec.origin.throttle:
        argv += ["--throttle", str(spec.origin.throttle)]
    child = await start_child("origin", argv, ready, workdir / "logs")
    try:
        info = await wait_ready(child, 120.0)
    except BaseException:  # not ready in time, or `up` interrupted: not left running
        await child.stop()
        raise
    return child, str(info["url"])


async def start_agent(node: str, budget_bytes: int, workdir: Path, token: str) -> Child:
    """The agent requires ``token`` (``Authorization: Bearer``) on its mutating routes."""
    ready = workdir / "run" / f"agent-{node}.json"
    argv = module_argv(
        AGENT_MODULE,
        "--root",
        str(workdir / "nodes" / node),
        "--budget",
        str(budget_bytes),
        "--ready-file",
        str(ready),
    )
    env = {**os.environ, AGENT_TOKEN_ENV: token}
    return await start_child(f"agent-{node}", argv, ready, workdir / "logs", env)


def parse_reports(doc: dict[str, Any]) -> tuple[dict[str, NodeCacheReport], dict[str, str]]:
    """An agent's ``/v1/fleet/caches`` -> reports by cache and published paths by cache."""
    reports: dict[str, NodeCacheReport] = {}
    paths: dict[str, str] = {}
    for cache, item in (doc.get("caches") or {}).items():
        reports[cache] = NodeCacheReport(
            _STATES.get(str(item.get("state")), NodeCacheState.PENDING),
            int(item.get("bytesDone") or 0),
            int(item.get("bytesTotal") or 0),
            bool(item.get("healthy", True)),
            str(item.get("message") or ""),
        )
        if item.get("path"):
            paths[cache] = str(item["path"])
    return reports, paths


async def get_json(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=2.0)) as resp:
        resp.raise_for_status()
        doc = await resp.json()
    return doc if isinstance(doc, dict) else {}


async def scrape_metrics(session: aiohttp.ClientSession, gateway_url: str) -> str | None:
    """The gateway's ``/metrics`` text; None when the scrape failed."""
    try:
        async with session.get(
            gateway_url + "/metrics", timeout=aiohttp.ClientTimeout(total=2.0)
        ) as resp:
            return await resp.text() if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def put_json(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], token: str | None = None
) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = aiohttp.ClientTimeout(total=2.0)
    async with session.put(url, json=body, headers=headers, timeout=timeout) as resp:
        resp.raise_for_status()


async def put_assignments(
    session: aiohttp.ClientSession, agent_url: str, body: dict[str, Any], token: str
) -> None:
    """``PUT /v1/fleet/assignments`` with the agent's token."""
    await put_json(session, agent_url + "/v1/fleet/assignments", body, token)


def gateway_document(spec: LocalFleetSpec, workdir: Path) -> dict[str, Any]:
    endpoints = []
    for entry in spec.endpoints:
        variants = []
        for variant in entry.spec.variants:
            path = instance_file(workdir, entry.name, variant.name)
            if not path.exists():
                write_instances(path, [])
            variants.append(
                {
                    "name": variant.name,
                    "weight": variant.traffic_weight,
                    "routing": variant.routing.model_dump(mode="json", by_alias=True),
                    "discovery": {
                        "type": "file",
                        "path": str(path),
                        "pollIntervalS": spec.gateway.poll_interval_s,
                    },
                }
            )
        endpoints.append({"name": entry.name, "variants": variants})
    return {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "Gateway",
        "spec": {
            "listen": {"host": spec.gateway.host, "port": spec.gateway.port},
            "health": {"intervalS": 1.0, "timeoutS": 0.5},
            "hold": {
                "timeoutS": spec.gateway.hold_timeout_s,
                "maxHeldPerVariant": spec.gateway.max_held_per_variant,
            },
            "endpoints": endpoints,
        },
    }


async def start_gateway(spec: LocalFleetSpec, workdir: Path) -> StartedApp:
    config = parse_gateway_config(gateway_document(spec, workdir), "embedded gateway")
    app = create_app(config)
    return await start_app(
        app, spec.gateway.host, spec.gateway.port, host_field="spec.gateway.host"
    )
