"""``state.json``: what a running ``warmfleet up`` exposes, and ``warmfleet status``'s tables.

``warmfleet status`` believes ``state.json`` only while the fleet that wrote it is alive: ``up``
wrote ``running: true``, its process still exists and its gateway accepts connections
(``not_running_reason``). A fleet stopped cleanly or killed, or whose gateway no longer listens,
is "not running", whatever phases its last state shows.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any, Protocol
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from warmfleet.api.names import READY_VALUE
from warmfleet.api.resources import wire
from warmfleet.control.placement import unprepared_share
from warmfleet.control.world import World
from warmfleet.core.errors import ConfigError, NotFoundError
from warmfleet.display import NA, Column, Grid, OutputFormat, emit, fixed, num, pct, size
from warmfleet.gateway.server import StartedApp
from warmfleet.local.config import LocalFleetSpec
from warmfleet.local.procs import Child, FleetProcessError
from warmfleet.local.replicas import Replica

STATE_FILE = "state.json"
IN_FLIGHT = "warmfleet_gateway_in_flight_requests"
MAX_EVENTS = 200
MAX_HISTORY = 1000  # replicas kept in the history (the oldest gone ones are dropped first)


def in_flight_by_instance(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == IN_FLIGHT and "instance_id" in sample.labels:
                key = sample.labels["instance_id"]
                out[key] = out.get(key, 0.0) + sample.value
    return out


def trim_history(history: dict[str, Any], live: set[str], limit: int) -> None:
    """Drop the oldest entries of replicas that are gone (not in ``live``) until at most
    ``limit`` remain (``history`` is in start order)."""
    excess = len(history) - limit
    for name in [n for n in history if n not in live][: max(excess, 0)]:
        del history[name]


def start_times(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Median time to ready of replicas started warm (node cache) and cold (origin)."""
    warm = [h["timeToReadyS"] for h in history if h["prepared"] and h.get("timeToReadyS")]
    cold = [h["timeToReadyS"] for h in history if not h["prepared"] and h.get("timeToReadyS")]
    warm_load = [h["weightsLoadS"] for h in history if h["prepared"] and h.get("weightsLoadS")]
    cold_load = [h["weightsLoadS"] for h in history if not h["prepared"] and h.get("weightsLoadS")]
    return {
        "warmStartS": statistics.median(warm) if warm else None,
        "coldStartS": statistics.median(cold) if cold else None,
        "warmWeightsLoadS": statistics.median(warm_load) if warm_load else None,
        "coldWeightsLoadS": statistics.median(cold_load) if cold_load else None,
        "warmStarts": len(warm),
        "coldStarts": len(cold),
        "unpreparedReplicaShare": unprepared_share([h["prepared"] for h in history]),
    }


class FleetView(Protocol):
    """What ``state.json`` is made of: the running fleet (``fleet.EmbeddedFleet``), read only."""

    @property
    def spec(self) -> LocalFleetSpec: ...
    @property
    def world(self) -> World: ...
    @property
    def agents(self) -> Mapping[str, Child]: ...
    @property
    def agent_urls(self) -> Mapping[str, str]: ...
    @property
    def replicas(self) -> Mapping[str, Replica]: ...
    @property
    def history(self) -> Mapping[str, dict[str, Any]]: ...
    @property
    def events(self) -> Iterable[dict[str, Any]]: ...
    @property
    def gateway(self) -> StartedApp | None: ...
    @property
    def origin(self) -> Child | None: ...
    @property
    def origin_url(self) -> str: ...
    @property
    def passes(self) -> int: ...
    @property
    def last_pass_s(self) -> float: ...
    def now_s(self) -> float: ...


def _nodes(fleet: FleetView) -> list[dict[str, Any]]:
    out = []
    for config in fleet.spec.nodes:
        node = fleet.world.nodes[config.name]
        agent = fleet.agents.get(config.name)
        out.append(
            {
                "name": config.name,
                "budgetBytes": config.budget,
                "agentPid": agent.pid if agent else None,
                "agentUp": config.name in fleet.agent_urls,
                "readyLabels": sorted(k for k, v in node.labels.items() if v == READY_VALUE),
                "assigned": sorted(node.assigned),
                "caches": {
                    c: {
                        "state": r.state.value,
                        "bytesDone": r.bytes_done,
                        "bytesTotal": r.bytes_total,
                        "healthy": r.healthy,
                    }
                    for c, r in node.weights.items()
                },
            }
        )
    return out


def snapshot(fleet: FleetView, *, running: bool) -> dict[str, Any]:
    endpoints = [
        {"name": e.name, "status": wire(e.status) if e.status else None}
        for e in fleet.world.endpoints.values()
    ]
    caches = [
        {
            "name": c.name,
            "owner": c.spec.owner,
            "source": wire(c.spec.model_source),
            "status": wire(c.status) if c.status else None,
        }
        for c in fleet.world.model_caches.values()
    ]
    history = list(fleet.history.values())
    return {
        "running": running,
        "pid": os.getpid(),
        "uptimeS": round(fleet.now_s(), 3),
        "passes": fleet.passes,
        "lastPassS": round(fleet.last_pass_s, 4),
        "gateway": fleet.gateway.url if fleet.gateway else None,
        "origin": fleet.origin_url,
        "originPid": fleet.origin.pid if fleet.origin else None,
        "endpoints": endpoints,
        "caches": caches,
        "nodes": _nodes(fleet),
        "replicas": [r.summary() for r in fleet.replicas.values()],
        "starts": start_times(history),
        "history": history,
        "events": list(fleet.events),  # the last MAX_EVENTS (a bounded deque)
    }


def lock_workdir(workdir: Path) -> IO[str]:
    """The workdir's lock, held while one fleet runs there (a second ``up`` would share its
    node roots, ready files, instance files and state.json with the running one)."""
    lock = (workdir / "fleet.lock").open("a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise FleetProcessError(
            f"another `warmfleet up` is running in {workdir} (`warmfleet status --workdir` "
            "shows it); stop it first or give another --workdir"
        ) from None
    return lock


def write_state(workdir: Path, doc: dict[str, Any]) -> None:
    path = workdir / STATE_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str), encoding="utf-8")
    tmp.replace(path)


def read_state(workdir: Path) -> dict[str, Any]:
    path = workdir / STATE_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise NotFoundError(f"no state at {path} (start it with `warmfleet up`)") from err
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: not the state `warmfleet up` writes (not a JSON object)")
    return doc


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def _accepts_connections(url: str, timeout_s: float) -> bool:
    split = urlsplit(url)
    host = split.hostname or "127.0.0.1"
    if host in ("0.0.0.0", "::"):  # a wildcard bind: reachable on loopback
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    try:
        port = split.port or (443 if split.scheme == "https" else 80)
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def not_running_reason(doc: dict[str, Any], *, timeout_s: float = 2.0) -> str | None:
    """Why the fleet that wrote ``doc`` is not running, or None when it is: ``up`` recorded its
    stop, its process (``pid``) is gone, or its gateway refuses connections."""
    if not doc.get("running"):
        return "it was stopped"
    pid = doc.get("pid")
    if not isinstance(pid, int) or pid <= 0 or not _pid_alive(pid):
        return f"its process (pid {pid}) is gone"
    gateway = doc.get("gateway")
    if isinstance(gateway, str) and not _accepts_connections(gateway, timeout_s):
        return f"its gateway {gateway} does not accept connections (pid {pid})"
    return None


def render(
    doc: dict[str, Any],
    console: Console,
    fmt: OutputFormat = OutputFormat.table,
    wide: bool = False,
) -> None:
    """``warmfleet status``: a header line, the endpoints, caches, nodes and replicas tables and
    the start times (``--format json``: the state document itself)."""
    grids = [_endpoints(doc), _caches(doc), _nodes_table(doc), _replicas(doc)]
    if fmt != OutputFormat.table:
        emit(grids, fmt, console=console, document=doc)
        return
    state = "running" if doc.get("running") else "stopped"
    console.print(
        f"fleet {state} (pid {doc.get('pid')}, up {fixed(doc.get('uptimeS'), 0)} s), "
        f"gateway {doc.get('gateway')}, origin {doc.get('origin')}",
        markup=False,
    )
    emit(grids, fmt, wide=wide, console=console)
    console.print(starts_line(doc.get("starts", {})), markup=False)


def starts_line(starts: dict[str, Any]) -> str:
    """Median time to ready (and weights load) of warm and cold starts, for people."""

    def median(kind: str) -> str:
        ready, load = starts.get(f"{kind}StartS"), starts.get(f"{kind}WeightsLoadS")
        if ready is None:
            return f"{kind}: none yet"
        return (
            f"{kind} {num(ready)} s (weights {num(load)} s, {starts.get(f'{kind}Starts', 0)} "
            "starts)"
        )

    share = starts.get("unpreparedReplicaShare")
    return (
        f"median time to ready: {median('warm')}; {median('cold')}; "
        f"replicas started unprepared: {pct(share, 0)}"
    )


def _endpoints(doc: dict[str, Any]) -> Grid:
    columns = (
        Column("name", left=True), Column("phase", left=True),
        Column("revision", left=True, drop=2), Column("replicas"), Column("ready"),
        Column("unprepared share", drop=1),
    )  # fmt: skip
    grid = Grid("endpoints", columns)
    for e in doc.get("endpoints", []):
        s = e.get("status") or {}
        grid.add(
            e["name"],
            str(s.get("phase", "")),
            str(s.get("revision", "")),
            str(s.get("replicas", 0)),
            str(s.get("readyReplicas", 0)),
            pct(s.get("unpreparedReplicaShare", 0.0), 0),
        )
    return grid


def _caches(doc: dict[str, Any]) -> Grid:
    columns = (
        Column("name", left=True), Column("source", left=True, wrap=True, drop=1),
        Column("state", left=True), Column("ready/target nodes"),
    )  # fmt: skip
    grid = Grid("caches", columns)
    for c in doc.get("caches", []):
        s = c.get("status") or {}
        src = c.get("source", {})
        grid.add(
            c["name"],
            f"{src.get('uri')}@{src.get('revision')}",
            str(s.get("state", "")),
            f"{s.get('readyNodes', 0)}/{s.get('targetNodes', 0)}",
        )
    return grid


def _nodes_table(doc: dict[str, Any]) -> Grid:
    columns = (
        Column("name", left=True), Column("agent", left=True), Column("budget", drop=2),
        Column("ready labels", left=True, wrap=True, drop=3),
        Column("caches", left=True, wrap=True, drop=1),
    )  # fmt: skip
    grid = Grid("nodes", columns)
    for n in doc.get("nodes", []):
        caches = "\n".join(
            f"{k}: {v['state']} {size(v['bytesDone'])}/{size(v['bytesTotal'])}"
            + ("" if v["healthy"] else " (unhealthy)")
            for k, v in n.get("caches", {}).items()
        )
        agent = f"up (pid {n['agentPid']})" if n.get("agentUp") else "DOWN"
        grid.add(n["name"], agent, size(n["budgetBytes"]), "\n".join(n["readyLabels"]), caches)
    return grid


def _replicas(doc: dict[str, Any]) -> Grid:
    columns = (
        Column("name", left=True), Column("node", left=True), Column("state", left=True),
        Column("weights from", left=True, drop=2), Column("time to ready", drop=1),
        Column("url", left=True, drop=3),
    )  # fmt: skip
    grid = Grid("replicas", columns)
    for r in doc.get("replicas", []):
        ttr = r.get("timeToReadyS")
        grid.add(
            r["name"],
            r["node"],
            r["state"],
            r["loadSource"],
            NA if ttr is None else f"{num(ttr)} s",
            str(r.get("url") or NA),
        )
    return grid
