"""Status of caches and endpoints computed from observations (pure, deterministic).

No timestamps are written here: equal observations give equal statuses, so the reconciler only
emits a status update when something actually changed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from warmfleet.api.resources import (
    CacheState,
    CacheStatus,
    Condition,
    GatePolicy,
    NodeProgress,
)
from warmfleet.control.observed import NodeCacheReport, NodeCacheState, ObservedNode

_IN_PROGRESS = frozenset(
    {NodeCacheState.PENDING, NodeCacheState.DOWNLOADING, NodeCacheState.VERIFYING}
)


@dataclass(frozen=True, slots=True)
class CacheCounts:
    target: int
    ready: int
    failed: int
    in_progress: int


def target_nodes(nodes: Sequence[ObservedNode], selector: Mapping[str, str]) -> list[ObservedNode]:
    return sorted((n for n in nodes if n.ready and n.matches(selector)), key=lambda n: n.name)


def count(reports: Sequence[NodeCacheReport | None]) -> CacheCounts:
    ready = sum(1 for r in reports if r is not None and r.usable)
    failed = sum(1 for r in reports if r is not None and r.state == NodeCacheState.FAILED)
    busy = sum(1 for r in reports if r is not None and r.state in _IN_PROGRESS)
    return CacheCounts(len(reports), ready, failed, busy)


def cache_state(counts: CacheCounts, *, deleting: bool = False) -> CacheState:
    if deleting:
        return CacheState.DELETING
    if counts.target > 0 and counts.ready == counts.target:
        return CacheState.READY
    if counts.target > 0 and counts.failed == counts.target:
        return CacheState.FAILED
    if counts.ready > 0 and counts.ready + counts.failed == counts.target:
        return CacheState.PARTIALLY_READY
    if counts.in_progress > 0 or counts.ready > 0:
        return CacheState.DOWNLOADING
    return CacheState.PENDING


def _progress(node: str, report: NodeCacheReport | None) -> NodeProgress:
    if report is None:
        return NodeProgress(node=node, state="Pending")
    state = report.state.value.capitalize()
    if report.state == NodeCacheState.READY and not report.healthy:
        state = "Unhealthy"
    return NodeProgress(
        node=node,
        state=state,
        bytes_done=report.bytes_done,
        bytes_total=report.bytes_total,
        message=report.message,
    )


def cache_status(
    reports: Mapping[str, NodeCacheReport | None], *, deleting: bool = False
) -> CacheStatus:
    """``reports`` maps every target node name to its report (None: nothing reported yet)."""
    counts = count(list(reports.values()))
    state = cache_state(counts, deleting=deleting)
    failed = sorted(
        n for n, r in reports.items() if r is not None and r.state == NodeCacheState.FAILED
    )
    unhealthy = sorted(
        n
        for n, r in reports.items()
        if r is not None and r.state == NodeCacheState.READY and not r.healthy
    )
    conditions = [
        Condition(
            type="Ready",
            status="True" if state == CacheState.READY else "False",
            reason=state.value,
            message=f"{counts.ready}/{counts.target} nodes ready",
        )
    ]
    if failed:
        conditions.append(
            Condition(
                type="NodeFailures",
                status="True",
                reason="DownloadFailed",
                message=", ".join(failed),
            )
        )
    if unhealthy:
        conditions.append(
            Condition(
                type="NodeUnhealthy",
                status="True",
                reason="CacheUnhealthy",
                message=", ".join(unhealthy),
            )
        )
    return CacheStatus(
        state=state,
        ready_nodes=counts.ready,
        target_nodes=counts.target,
        nodes=tuple(_progress(n, reports[n]) for n in sorted(reports)),
        conditions=tuple(conditions),
        message=f"{counts.ready}/{counts.target} nodes ready",
    )


@dataclass(frozen=True, slots=True)
class GateDecision:
    open: bool
    reason: str
    message: str


def gate_decision(
    policy: GatePolicy, counts: CacheCounts, cache_age_s: float | None
) -> GateDecision:
    """Whether a Deployment may be created given the weights cache's readiness.

    ``cache_age_s`` is None while the cache object does not exist yet.
    """
    if policy.mode == "none":
        return GateDecision(True, "GateDisabled", "gate mode none")
    if cache_age_s is None:
        return GateDecision(False, "CacheNotCreated", "weights cache not created yet")
    need = _needed(policy, counts.target)
    progress = f"{counts.ready}/{counts.target} nodes ready, {need} needed"
    if counts.target > 0 and counts.ready >= need:
        return GateDecision(True, "CacheReady", progress)
    if policy.timeout_s is not None and cache_age_s >= policy.timeout_s:
        return GateDecision(True, "GateTimeout", f"{progress}; timed out after {policy.timeout_s}s")
    reason = "NoTargetNodes" if counts.target == 0 else "WaitingForCache"
    return GateDecision(False, reason, progress)


def _needed(policy: GatePolicy, target: int) -> int:
    if policy.mode == "all":
        return target
    if policy.min_ready_nodes is not None:
        return max(1, min(policy.min_ready_nodes, target))
    percent = policy.min_ready_percent or 100.0
    return max(1, math.ceil(target * percent / 100.0 - 1e-9))
