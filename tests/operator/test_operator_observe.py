"""Kubernetes objects -> observed state: what node agents write must not stop the pass."""

from __future__ import annotations

import json
from typing import Any

from warmfleet.control.observed import NodeCacheState
from warmfleet.operator import render
from warmfleet.operator.observe import Snapshot, observed_state


def _node(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"pool": "gpu"}, "annotations": annotations}}


def test_unreadable_node_annotations_count_as_not_reported() -> None:
    good = {"state": "ready", "bytesDone": 5, "bytesTotal": 5, "healthy": True}
    nodes = [
        _node("n0", {render.ANN_CACHE_STATUS: "{not json", render.ANN_ASSIGNED: "oops"}),
        _node("n1", {render.ANN_CACHE_STATUS: json.dumps({"a": good, "b": {"state": "new"}})}),
        _node("n2", {render.ANN_CACHE_STATUS: json.dumps(["a"])}),
        _node("n3", {render.ANN_ASSIGNED: json.dumps([{"cache": "a"}])}),
    ]
    snapshot = Snapshot([], nodes, [], [], [], [], [])
    observed = observed_state(snapshot, 0.0)
    by_name = {n.name: n for n in observed.nodes}
    assert by_name["n0"].weights == {}
    assert by_name["n0"].assigned == frozenset()
    assert set(by_name["n1"].weights) == {"a"}
    assert by_name["n1"].weights["a"].state == NodeCacheState.READY
    assert by_name["n2"].weights == {}
    assert by_name["n3"].assigned == frozenset({"a"})
