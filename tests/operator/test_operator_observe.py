"""Kubernetes objects -> observed state: what node agents write must not stop the pass."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from warmfleet.control.actions import ReleaseEndpoint
from warmfleet.control.observed import NodeCacheState
from warmfleet.control.reconciler import plan
from warmfleet.operator import render
from warmfleet.operator.observe import ANN_AUTOSCALED, Snapshot, desired_endpoints, observed_state


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


def _endpoint(name: str, autoscaled: str) -> dict[str, Any]:
    spec = {
        "modelSource": {"uri": "s3://models/m", "revision": "v1"},
        "image": "vllm/vllm-openai:v0.9",
        "variants": [{"name": "main", "replicas": 2}],
    }
    meta = {"name": name, "annotations": {ANN_AUTOSCALED: autoscaled}}
    return {"metadata": meta, "spec": spec}


def test_an_unreadable_autoscaled_annotation_counts_as_absent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = ["{oops", "[3]", json.dumps({"main": "x"}), json.dumps({"main": [1]})]
    endpoints = [_endpoint(f"bad{i}", raw) for i, raw in enumerate(bad)]
    endpoints.append(_endpoint("good", json.dumps({"main": 5})))
    with caplog.at_level(logging.WARNING, logger="warmfleet.operator.observe"):
        desired = desired_endpoints(Snapshot(endpoints, [], [], [], [], [], []))
    by_name = {e.name: e for e in desired}
    assert set(by_name) == {"bad0", "bad1", "bad2", "bad3", "good"}
    assert all(by_name[f"bad{i}"].autoscaled_replicas == {} for i in range(len(bad)))
    assert by_name["good"].autoscaled_replicas == {"main": 5}
    warned = [r.getMessage() for r in caplog.records if ANN_AUTOSCALED in r.getMessage()]
    assert len(warned) == len(bad)


def test_a_deleting_endpoint_whose_spec_no_longer_validates_is_still_released() -> None:
    """The CRD schema accepts ``gate: {mode: minReady}`` without its threshold; the operator
    does not. Such an endpoint is skipped while it lives, but its deletion must collect what it
    owns and release it (skipped, its finalizer stayed for good)."""
    spec: dict[str, Any] = {
        "modelSource": {"uri": "s3://m/x"},
        "image": "vllm:1",
        "variants": [{"name": "main"}],
        "modelCacheConfig": {"weightsCache": {"enabled": True, "gate": {"mode": "minReady"}}},
    }
    meta = {"name": "e", "namespace": "default", "uid": "u1"}
    live: dict[str, Any] = {"metadata": meta, "spec": spec}
    assert desired_endpoints(Snapshot([live], [], [], [], [], [], [])) == []
    gone = {**meta, "deletionTimestamp": "2026-12-07T00:00:00Z"}
    deleting: dict[str, Any] = {"metadata": gone, "spec": spec}
    snapshot = Snapshot([deleting], [], [], [], [], [], [])
    (endpoint,) = desired_endpoints(snapshot)
    assert endpoint.deleting
    assert ReleaseEndpoint("e") in plan([endpoint], observed_state(snapshot, 0.0))
