"""Faults on the real control plane: the operator killed mid-reconcile and restarted, and a Node
lost under gateway traffic. Opt-in: ``make k8s-e2e``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from k8s.controlplane import ControlPlane, ControlPlaneError
from k8s.endpoints import emulator_args, inference_endpoint
from k8s.k8s_results import ENABLED, LOG_DIR, SKIP_REASON, Results
from k8s.kubelet_stub import StubKubelet, register_node, wait_for
from k8s.load import Load
from k8s.procs import CLI, Proc, start_gateway, start_operator

pytestmark = [pytest.mark.k8s, pytest.mark.skipif(not ENABLED, reason=SKIP_REASON)]

NS = "faults"
POOL = {"e2e.warmfleet.dev/pool": "faults"}
NODES = ["wf-f-1", "wf-f-2", "wf-f-3"]
API = f"/apis/warmfleet.dev/v1alpha1/namespaces/{NS}"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def world(control_plane: ControlPlane, rbac: list[Obj], crds: int) -> Iterator[dict[str, Any]]:
    plane = control_plane
    status, body = plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    assert status == 201, body
    kubelet = StubKubelet(plane, NODES, LOG_DIR, ip_prefix="127.0.3.")
    state: dict[str, Any] = {"kubelet": kubelet}
    try:
        for i, node in enumerate(NODES):
            register_node(plane, node, f"127.0.0.{31 + i}", POOL, {"nvidia.com/gpu": "1"})
        kubelet.start()
        state["operator"] = start_operator(plane, NS)
        yield state
    finally:
        kubelet.stop()
        state["operator"].stop()
        plane.request("DELETE", f"/api/v1/namespaces/{NS}")


def endpoint() -> Obj:
    return inference_endpoint(
        "theta",
        NS,
        replicas=2,
        port=8000,
        gpusPerReplica=1,
        nodeSelector=POOL,
        command=CLI,
        args=emulator_args("theta", 8000),
    )


def ready_pods(plane: ControlPlane) -> list[Obj]:
    return [
        p
        for p in plane.items(f"/api/v1/namespaces/{NS}/pods")
        if not p["metadata"].get("deletionTimestamp")
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (p.get("status") or {}).get("conditions") or []
        )
    ]


def test_operator_killed_mid_reconcile_converges_after_restart(
    control_plane: ControlPlane, world: dict[str, Any], results: Results
) -> None:
    plane = control_plane
    status, body = plane.request("POST", f"{API}/inferenceendpoints", endpoint())
    assert status == 201, body

    def first_child() -> bool:
        children = plane.items(f"/apis/apps/v1/namespaces/{NS}/deployments")
        children += plane.items(f"/api/v1/namespaces/{NS}/services")
        return bool(children)

    wait_for("the operator's first object for theta", first_child, 60)
    operator: Proc = world["operator"]
    operator.kill()  # mid-reconcile: its pass had started writing theta's objects
    killed_at = time.monotonic()
    world["operator"] = start_operator(plane, NS)

    last: dict[str, Any] = {}

    def converged() -> dict[str, Any] | None:
        deployments = plane.items(f"/apis/apps/v1/namespaces/{NS}/deployments")
        services = plane.items(f"/api/v1/namespaces/{NS}/services")
        theta = plane.get_json(f"{API}/inferenceendpoints/theta")
        phase = (theta.get("status") or {}).get("phase")
        pods = ready_pods(plane)
        last.update(
            deployments=[d["metadata"]["name"] for d in deployments],
            services=[v["metadata"]["name"] for v in services],
            phase=phase,
            ready_pods=len(pods),
            status=theta.get("status"),
        )
        done = len(deployments) == 1 and len(services) == 2 and len(pods) == 2
        return {"phase": phase, "pods": len(pods)} if done and phase == "Ready" else None

    try:
        state = wait_for("theta converged after the restart", converged, 90)
    except ControlPlaneError:
        results.record(operator_restart_ok=False, operator_restart_last_state=last)
        raise
    results.record(
        operator_restart_ok=True,
        operator_restart_converge_s=round(time.monotonic() - killed_at, 1),
        operator_restart_state=state,
    )


def test_node_lost_under_load_loses_no_request(
    control_plane: ControlPlane, world: dict[str, Any], results: Results
) -> None:
    """A node with one of theta's two replicas dies (its process is killed) and its Node object
    is deleted, while a gateway carries steady traffic; the pod garbage collector deletes the
    orphaned pod, the ReplicaSet replaces it on the spare node."""
    plane = control_plane
    kubelet: StubKubelet = world["kubelet"]

    def two_ready() -> list[Obj] | None:
        found = ready_pods(plane)
        return found if len(found) == 2 else None

    pods = wait_for("2 ready replicas", two_ready)
    victim = pods[0]["spec"]["nodeName"]
    gateway = start_gateway(plane, "theta", "theta-main", NS)
    try:
        with Load(gateway.url, "theta") as load:
            wait_for("traffic through the gateway", lambda: load.ok >= 5, 60)
            load.reset()
            lost = kubelet.lose_node(victim)
            status, body = plane.request("DELETE", f"/api/v1/nodes/{victim}")
            assert status == 200, body
            t0 = time.monotonic()

            def replaced() -> list[Obj] | None:
                now = ready_pods(plane)
                on_live = [p for p in now if p["spec"]["nodeName"] != victim]
                return on_live if len(on_live) == 2 and len(now) == 2 else None

            wait_for("the lost replica replaced on a live node", replaced, 150)
            replaced_s = time.monotonic() - t0
            time.sleep(2.0)
    finally:
        gateway.stop()
    results.record(
        node_loss_requests=load.ok + load.failures,
        node_loss_failed_requests=load.failures,
        node_loss_failures=dict(load.failed),
        node_loss_pods_lost=len(lost),
        node_loss_replaced_s=round(replaced_s, 1),
    )
    assert lost
    assert load.failures == 0, dict(load.failed)
