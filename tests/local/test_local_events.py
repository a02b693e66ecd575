"""What ``warmfleet up`` says about its events and its cache fills (``local/events.py``),
in-process: one line per event, a fill's start and end, a cache's ready or failed state once."""

from __future__ import annotations

import io
import re

from rich.console import Console

from warmfleet.bench.progress import Activity
from warmfleet.control.actions import DeleteModelCache, ScaleDeployment, SetNodeLabels
from warmfleet.control.observed import NodeCacheReport, NodeCacheState
from warmfleet.local.events import FleetLog, action_event, describe


def _lines(buffer: io.StringIO) -> list[str]:
    return [re.sub(r"^\d\d:\d\d:\d\d ", "", line) for line in
            buffer.getvalue().splitlines()]  # fmt: skip


def test_events_read_as_sentences() -> None:
    assert describe({"kind": "DeleteModelCache", "name": "m-v1"}) == "old cache m-v1 deleted"
    switched = {"kind": "gateway_switched", "endpoint": "m", "variant": "main",
                "instances": ["m-2", "m-3"]}  # fmt: skip
    assert describe(switched) == "gateway switched: m/main -> m-2, m-3"
    assert describe({**switched, "instances": []}) == "gateway switched: m/main -> no instance"
    ready = {"kind": "replica_ready", "replica": "m-2", "node": "n1"}
    assert describe(ready) == "replica m-2 ready on n1"
    started = {"kind": "replica_started", "replica": "m-2", "node": "n1", "prepared": False}
    assert describe(started) == "replica m-2 started on n1 (weights from the origin)"
    assert describe({"kind": "something_new", "a": 1}) == "something_new a=1"


def test_actions_become_events() -> None:
    recorded = action_event(SetNodeLabels("n1", {"weights.warmfleet.dev/c": "ready"}, ("x",)))
    assert recorded is not None
    kind, fields = recorded
    assert describe({"kind": kind, **fields}) == (
        "node n1 ready: weights.warmfleet.dev/c; node n1 no longer ready: x"
    )
    assert action_event(DeleteModelCache("c")) == ("DeleteModelCache", {"name": "c"})
    assert action_event(ScaleDeployment("d", 2)) == (
        "ScaleDeployment",
        {"name": "d", "replicas": 2},
    )


def test_a_fill_is_started_followed_and_ended_once() -> None:
    buffer = io.StringIO()
    with Activity(console=Console(file=buffer, width=200)) as activity:
        watcher = FleetLog(activity)
        total = 100_000_000
        steps = [
            NodeCacheReport(NodeCacheState.PENDING, 0, 0),
            NodeCacheReport(NodeCacheState.DOWNLOADING, 10_000_000, total),
            NodeCacheReport(NodeCacheState.VERIFYING, total, total),
            NodeCacheReport(NodeCacheState.READY, total, total),
            NodeCacheReport(NodeCacheState.READY, total, total),  # said once
            NodeCacheReport(NodeCacheState.FAILED, 0, total, message="SourceError: gone"),
        ]
        for report in steps:
            watcher.caches("n1", {"c": report})
        watcher.event({"t": 1.0, "kind": "DeleteModelCache", "name": "c"})
    lines = _lines(buffer)
    assert lines[0] == "cache c filling on n1: started (100.0 MB)"
    assert lines[1].startswith("cache c filling on n1: done, 100.0 MB in ")
    assert lines[2:] == [
        "cache c ready on n1",
        "cache c failed on n1: SourceError: gone",
        "old cache c deleted",
    ]
