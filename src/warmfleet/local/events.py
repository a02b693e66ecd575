"""What ``warmfleet up`` tells its user as it happens.

The fleet (``fleet.EmbeddedFleet``) records an event for each thing it does or learns (an action
of the reconciler applied, a replica started or ready, the gateway's instances switched) and
passes each one, and each node's cache reports, to its ``FleetWatcher``. ``FleetLog`` is the
watcher of ``warmfleet up``: one line per event (``describe``) and, per cache filling on a node,
its bytes with rate and ETA (``bench.progress``: a live bar on a terminal, plain lines at a
bounded rate when piped).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from warmfleet.api.names import READY_VALUE
from warmfleet.bench.progress import Activity, Tracker
from warmfleet.control.actions import (
    Action,
    ApplyDeployment,
    ApplyModelCache,
    AssignNodeCaches,
    DeleteDeployment,
    DeleteModelCache,
    ScaleDeployment,
    SetNodeLabels,
)
from warmfleet.control.observed import NodeCacheReport, NodeCacheState

_FILLING = frozenset({NodeCacheState.DOWNLOADING, NodeCacheState.VERIFYING})


class FleetWatcher(Protocol):
    def event(self, doc: Mapping[str, Any]) -> None: ...

    def caches(self, node: str, reports: Mapping[str, NodeCacheReport]) -> None: ...


def action_event(action: Action) -> tuple[str, dict[str, Any]] | None:
    """The event (kind, fields) recorded for an applied reconciler action."""
    if isinstance(action, AssignNodeCaches):
        return "assign", {"node": action.node, "caches": [c.cache for c in action.caches]}
    if isinstance(action, SetNodeLabels):
        return "labels", {
            "node": action.node,
            "set": dict(action.set_labels),
            "removed": list(action.remove),
        }
    if isinstance(action, ApplyModelCache | DeleteModelCache | DeleteDeployment):
        return type(action).__name__, {"name": action.name}
    if isinstance(action, ApplyDeployment):
        return "ApplyDeployment", {"name": action.plan.name, "replicas": action.plan.replicas}
    if isinstance(action, ScaleDeployment):
        return "ScaleDeployment", {"name": action.name, "replicas": action.replicas}
    return None


def _labels(doc: Mapping[str, Any]) -> str:
    node = doc.get("node")
    ready = [k for k, v in (doc.get("set") or {}).items() if v == READY_VALUE]
    parts = [f"node {node} ready: {', '.join(ready)}"] if ready else []
    if doc.get("removed"):
        parts.append(f"node {node} no longer ready: {', '.join(doc['removed'])}")
    return "; ".join(parts) or f"node {node} labels {doc.get('set')}"


def _replica(doc: Mapping[str, Any]) -> str | None:
    kind, name, node = doc["kind"], doc.get("replica"), doc.get("node")
    if kind == "replica_started":
        source = "its node cache" if doc.get("prepared") else "the origin"
        return f"replica {name} started on {node} (weights from {source})"
    texts = {
        "replica_ready": f"replica {name} ready on {node}",
        "replica_draining": f"replica {name} draining",
        "replica_stopped": f"replica {name} stopped (pid {doc.get('pid')})",
        "replica_exited": f"replica {name} exited (rc {doc.get('rc')}), restart in "
        f"{doc.get('backoff_s')} s",
        "replica_start_timeout": f"replica {name} on {node} not ready in time: replaced",
    }
    return texts.get(kind)


def describe(doc: Mapping[str, Any]) -> str:
    """One line about an event of the fleet (its kind and fields)."""
    kind = doc["kind"]
    replica = _replica(doc)
    if replica is not None:
        return replica
    texts = {
        "fleet_started": f"fleet started: gateway {doc.get('gateway')}, origin {doc.get('origin')}",
        "assign": f"node {doc.get('node')} assigned caches: {', '.join(doc.get('caches') or [])}",
        "ApplyModelCache": f"cache {doc.get('name')} applied",
        "DeleteModelCache": f"old cache {doc.get('name')} deleted",
        "ApplyDeployment": f"deployment {doc.get('name')}: {doc.get('replicas')} replicas",
        "ScaleDeployment": f"deployment {doc.get('name')} scaled to {doc.get('replicas')}",
        "DeleteDeployment": f"deployment {doc.get('name')} deleted",
        "gateway_switched": f"gateway switched: {doc.get('endpoint')}/{doc.get('variant')} -> "
        f"{', '.join(doc.get('instances') or []) or 'no instance'}",
        "agent_down": f"node {doc.get('node')} agent down (pid {doc.get('pid')})",
        "agent_restarted": f"node {doc.get('node')} agent restarted (pid {doc.get('pid')})",
        "autoscaled": f"endpoint {doc.get('endpoint')} autoscaled: {doc.get('replicas')}",
        "endpoint_deleted": f"endpoint {doc.get('endpoint')} deleted",
        "fleet_file_reloaded": f"fleet file reloaded: {', '.join(doc.get('endpoints') or [])}",
    }
    if kind == "labels":
        return _labels(doc)
    fields = " ".join(f"{k}={v}" for k, v in doc.items() if k not in ("t", "kind"))
    return texts.get(kind, f"{kind} {fields}".rstrip())


class FleetLog:
    """``warmfleet up``'s watcher: event lines and cache fills on ``activity``."""

    def __init__(self, activity: Activity) -> None:
        self.activity = activity
        self._fills: dict[tuple[str, str], Tracker] = {}
        self._said: dict[tuple[str, str], str] = {}  # what was last said about a cache

    def event(self, doc: Mapping[str, Any]) -> None:
        self.activity.log(describe(doc))

    def caches(self, node: str, reports: Mapping[str, NodeCacheReport]) -> None:
        for cache, report in reports.items():
            self._cache(node, cache, report)

    def _cache(self, node: str, cache: str, report: NodeCacheReport) -> None:
        key = (node, cache)
        fill = self._fills.get(key)
        if report.state in _FILLING:
            if fill is None:
                total = report.bytes_total or None
                fill = self._fills[key] = self.activity.track(
                    f"cache {cache} filling on {node}", total, "bytes"
                )
            verifying = report.state == NodeCacheState.VERIFYING
            fill.update(
                report.bytes_done, report.bytes_total or None, "verifying" if verifying else ""
            )
            return
        if fill is not None:
            fill.update(report.bytes_total if report.usable else report.bytes_done, note="")
            fill.finish(keep=False)
            del self._fills[key]
        said = f"{report.state.value}:{report.message}"
        if report.state in (NodeCacheState.READY, NodeCacheState.FAILED) and (
            self._said.get(key) != said
        ):
            self._said[key] = said
            reason = f": {report.message}" if report.message else ""
            self.activity.log(f"cache {cache} {report.state.value} on {node}{reason}")
