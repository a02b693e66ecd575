"""Cache-gated deployment and warm placement on the real control plane.

Three GPU nodes (one ``nvidia.com/gpu`` each, so one replica per node) with a node agent each
(``warmfleet cache agent``, out of cluster with the ``warmfleet-node-agent`` service account),
an HTTP origin with a throttled link, and the operator. The InferenceEndpoint's weights gate is
``all``: no Deployment may exist before every target node's cache is ready. Its engines (run by
the stub kubelet) load their weights from the node's cache directory when the agent marked it
ready, else from the origin, so warm and cold starts are measured. Then a fourth node without an
agent joins and the endpoint scales to four: the extra replica runs cold from the origin. Then
two endpoints share an image cache, and delta rolls over to a new model revision under gateway
traffic. Opt-in: ``make k8s-e2e``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from k8s.controlplane import ControlPlane, ControlPlaneError
from k8s.gpu_world import (
    API,
    MODEL_BYTES,
    NS,
    POOL,
    PREPARED,
    bytes_under,
    cache_paths,
    deployments_of,
    endpoint,
    image_caches,
    image_endpoint,
    marked,
    ready_for,
    reported_ready,
    running_pods,
    start_agent,
    weights_load,
)
from k8s.k8s_results import ENABLED, LOG_DIR, SKIP_REASON, Results
from k8s.kubelet_stub import StubKubelet, register_node, wait_for
from k8s.load import Load
from k8s.procs import CLI, Proc, start_gateway, start_operator
from k8s.serviceaccounts import service_account_kubeconfig
from warmfleet.api import names
from warmfleet.local.origin_proc import generate_model

pytestmark = [pytest.mark.k8s, pytest.mark.skipif(not ENABLED, reason=SKIP_REASON)]

WARM_NODES = ["wf-gpu-1", "wf-gpu-2", "wf-gpu-3"]
COLD_NODE = "wf-gpu-4"
GPU = {"nvidia.com/gpu": "1"}
ORIGIN_BPS = 32_000_000  # the origin's link: a cold load takes ~1.5 s, a warm one ~0.1 s
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def world(
    control_plane: ControlPlane,
    rbac: list[Obj],
    crds: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """Origin, nodes, agents, stub kubelet and operator; every process stopped by PID."""
    plane = control_plane
    root = tmp_path_factory.mktemp("k8s-caching")
    status, body = plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    assert status == 201, body
    procs: list[Proc] = []
    nodes = [*WARM_NODES, COLD_NODE]
    kubelet = StubKubelet(plane, nodes, LOG_DIR, ip_prefix="127.0.2.", host_root=root / "nodes")
    try:
        origin_dir = root / "origin"
        for revision in ("r1", "r2"):
            generate_model(origin_dir / f"model-{revision}.bin", MODEL_BYTES, revision)
        ready = root / "origin.ready"
        procs.append(Proc("origin", [*CLI[:1], "-m", "warmfleet.local.origin_proc", "--dir",
                                     str(origin_dir), "--ready-file", str(ready),
                                     "--throttle", str(ORIGIN_BPS)]))  # fmt: skip
        origin = wait_for("the origin", lambda: ready.exists() and json.loads(ready.read_text()))
        agent_kubeconfig = service_account_kubeconfig(plane, "warmfleet-node-agent")
        for i, node in enumerate(WARM_NODES):
            register_node(plane, node, f"127.0.0.{21 + i}", POOL, GPU)
            procs.append(start_agent(root, node, agent_kubeconfig))
        kubelet.start()
        procs.append(start_operator(plane, NS))
        yield {"origin": origin["url"], "kubelet": kubelet, "root": root}
    finally:
        kubelet.stop()
        for proc in reversed(procs):
            proc.stop()
        plane.request("DELETE", f"/api/v1/namespaces/{NS}")


def test_gate_holds_then_replicas_start_warm(
    control_plane: ControlPlane, world: dict[str, Any], results: Results
) -> None:
    plane = control_plane
    status, body = plane.request("POST", f"{API}/inferenceendpoints", endpoint(world["origin"], 3))
    assert status == 201, body
    held_polls, violations = 0, []
    deadline = time.monotonic() + 120
    while True:  # until the Deployment exists: never before every target node is warm
        # the Deployments first, then the reports (which only go to ready): a Deployment seen
        # with a node not yet reported ready was created before that node was warm
        deployments = plane.items(f"/apis/apps/v1/namespaces/{NS}/deployments")
        warm = reported_ready(plane)
        if deployments:
            if not set(WARM_NODES) <= warm:
                violations.append(f"Deployment while only {sorted(warm)} were warm")
            break
        held_polls += 1
        assert time.monotonic() < deadline, f"no Deployment; warm nodes {sorted(warm)}"
        time.sleep(0.2)
    wait_for("3 ready replicas", lambda: running_pods(plane, 3), 90)
    # the operator records, when it first sees a replica on a node, whether that node was warm
    pods = wait_for("the operator's warm/cold mark on each replica", lambda: marked(plane, 3), 60)
    prepared = [p["metadata"]["annotations"][PREPARED] for p in pods]
    loads = [weights_load(LOG_DIR / f"pod-{p['metadata']['name']}.log") for p in pods]
    warm_loads = [w for w in loads if w and not str(w["source"]).startswith("http")]
    results.record(
        gate_held=held_polls > 0 and not violations,
        gate_held_polls=held_polls,
        warm_pod_fraction=round(prepared.count("true") / len(pods), 2),
        warm_engine_sources=len(warm_loads),
        warm_start_s=round(max(w["load_s"] for w in warm_loads), 3) if warm_loads else None,
    )
    assert not violations, violations
    assert held_polls > 0  # the hold was observed, not assumed
    assert prepared.count("true") / len(pods) >= 0.9
    assert len(warm_loads) == 3


def test_scale_out_beyond_the_warm_nodes_falls_back_to_the_origin(
    control_plane: ControlPlane, world: dict[str, Any], results: Results
) -> None:
    plane = control_plane
    register_node(plane, COLD_NODE, "127.0.0.24", POOL, GPU)  # no agent: never warm
    patch = {"spec": {"variants": [{"name": "main", "replicas": 4}]}}
    status, body = plane.request("PATCH", f"{API}/inferenceendpoints/delta", patch)
    assert status == 200, body
    wait_for("4 ready replicas", lambda: running_pods(plane, 4), 90)
    pods = wait_for("the operator's warm/cold mark on each replica", lambda: marked(plane, 4), 60)
    cold = [p for p in pods if p["spec"]["nodeName"] == COLD_NODE]
    assert len(cold) == 1
    load = wait_for("the cold engine's weights", lambda: weights_load(
        LOG_DIR / f"pod-{cold[0]['metadata']['name']}.log"))  # fmt: skip
    restarts = [s.get("restartCount", 0) for p in pods
                for s in (p.get("status") or {}).get("containerStatuses") or []]  # fmt: skip
    kubelet: StubKubelet = world["kubelet"]
    alive = all(r.popen is None or r.popen.poll() is None for r in kubelet.pods.values())
    warm = results.fields.get("warm_start_s")
    results.record(
        cold_fallback_ok=str(load["source"]).startswith("http") and alive and not any(restarts),
        cold_start_s=round(load["load_s"], 3),
        cold_prepared=cold[0]["metadata"]["annotations"][PREPARED],
    )
    assert str(load["source"]).startswith("http")
    assert alive
    assert warm is not None
    assert warm < load["load_s"]


def test_shared_image_cache_never_gates_and_is_refcounted(
    control_plane: ControlPlane, world: dict[str, Any], results: Results
) -> None:
    """Two endpoints on one image: their Deployments do not wait for the image pullers (whose
    pods never become ready here: their binary exists only in the image), the ImageCache counts
    both, and deleting the endpoints (the operator's own delete path: kopf's finalizer) takes
    the count to 1, then removes the cache and its puller DaemonSet."""
    plane = control_plane
    for name in ("epsilon", "zeta"):
        status, body = plane.request("POST", f"{API}/inferenceendpoints", image_endpoint(name))
        assert status == 201, body
    deployments_path = f"/apis/apps/v1/namespaces/{NS}/deployments"

    def both_deployed() -> bool:
        mine = [
            d["metadata"]["labels"].get(names.LABEL_ENDPOINT) for d in plane.items(deployments_path)
        ]
        return {"epsilon", "zeta"} <= set(mine)

    wait_for("both Deployments, without waiting for the image", both_deployed, 60)
    (cache,) = wait_for("the shared ImageCache", lambda: image_caches(plane) or None)
    pullers = plane.items(f"/apis/apps/v1/namespaces/{NS}/daemonsets")
    never_blocked = (
        not any((d.get("status") or {}).get("numberReady", 0) for d in pullers)
        and (cache.get("status") or {}).get("state") != "Ready"
    )
    refcounts = []

    def references(expected: int) -> int | None:
        found = image_caches(plane)
        count = len(found[0]["spec"].get("parentReferences") or []) if found else 0
        return count if count == expected else None

    refcounts.append(wait_for("2 references", lambda: references(2)))
    status, body = plane.request("DELETE", f"{API}/inferenceendpoints/epsilon")
    assert status == 200, body
    refcounts.append(wait_for("1 reference", lambda: references(1), 60))
    status, body = plane.request("DELETE", f"{API}/inferenceendpoints/zeta")
    assert status == 200, body
    wait_for("the ImageCache removed", lambda: not image_caches(plane), 60)
    refcounts.append(0)
    wait_for(
        "its puller DaemonSet removed",
        lambda: not plane.items(f"/apis/apps/v1/namespaces/{NS}/daemonsets"),
        60,
    )
    results.record(
        image_gate_never_blocks=never_blocked,
        image_refcounts=refcounts,
        image_refcount_ok=refcounts == [2, 1, 0],
    )
    assert never_blocked
    assert refcounts == [2, 1, 0]


def test_rollover_to_a_new_revision_under_load(
    control_plane: ControlPlane, world: dict[str, Any], results: Results
) -> None:
    """A new model revision while a gateway (discovering delta's pods through the real
    EndpointSlices) carries steady traffic: the new cache fills, passes the gate, the new
    Deployment comes up beside the old one (BlueGreen: each node gets a second GPU for it), the
    old one goes, then the old ModelCache and its bytes on every node."""
    plane = control_plane
    for node in [*WARM_NODES, COLD_NODE]:  # room for BlueGreen's second set of replicas
        gpus = {"nvidia.com/gpu": "2"}
        patch = {"status": {"capacity": gpus, "allocatable": gpus}}
        status, body = plane.request("PATCH", f"/api/v1/nodes/{node}/status", patch)
        assert status == 200, body
    old_caches = [c["metadata"]["name"] for c in plane.items(f"{API}/modelcaches")]
    (old_cache,) = old_caches
    old_paths = cache_paths(plane, old_cache)
    assert len(old_paths) == len(WARM_NODES)
    old_deployments = deployments_of(plane, "delta")
    gateway = start_gateway(plane, "delta", "delta-main", NS)
    try:
        with Load(gateway.url, "delta") as load:
            wait_for("traffic through the gateway", lambda: load.ok >= 5, 60)
            load.reset()  # count from here: the gateway is up and routing to delta's pods
            source = {"uri": f"{world['origin']}/files/model-r2.bin", "revision": "r2"}
            gate: Obj = {"mode": "minReady", "minReadyNodes": 3}  # the 4th node has no agent
            new_spec: Obj = {
                "spec": {
                    "modelSource": source,
                    "modelCacheConfig": {"weightsCache": {"gate": gate}},
                }
            }
            status, body = plane.request("PATCH", f"{API}/inferenceendpoints/delta", new_spec)
            assert status == 200, body

            gate_seen: dict[str, Any] = {"held_polls": 0}

            def rolled_over() -> bool:
                deployments = deployments_of(plane, "delta")
                caches = {c["metadata"]["name"] for c in plane.items(f"{API}/modelcaches")}
                watch_partial_gate(deployments - old_deployments, caches - {old_cache})
                new_only = bool(deployments) and not deployments & old_deployments
                return new_only and old_cache not in caches

            def watch_partial_gate(new_deployments: set[str], new_caches: set[str]) -> None:
                """minReady 3 of 4 target nodes: the new Deployment waits for 3 ready nodes
                (reports read after the Deployments: they only go to ready) and not for the
                4th, which has no agent."""
                if "ready_at_open" in gate_seen or not new_caches:
                    return
                ready = ready_for(plane, min(new_caches))
                if new_deployments:
                    gate_seen["ready_at_open"] = ready
                else:
                    gate_seen["held_polls"] += 1

            wait_for("the new revision in place of the old one", rolled_over, 180)
            new_pods = wait_for("4 ready replicas of r2", lambda: running_pods(plane, 4), 90)
            time.sleep(2.0)  # traffic on the new replicas only

        def old_bytes() -> int:
            return sum(bytes_under(path) for path in old_paths.values())

        with contextlib.suppress(ControlPlaneError):  # measured below either way
            wait_for("the old cache's bytes gone from every node", lambda: old_bytes() == 0, 60)
    finally:
        gateway.stop()
    at_open = sorted(gate_seen.get("ready_at_open", ()))
    gate_partial_ok = gate_seen["held_polls"] > 0 and at_open == sorted(WARM_NODES)
    results.record(
        gate_partial_ok=gate_partial_ok,
        gate_partial_ready_at_open=at_open,
        gate_partial_held_polls=gate_seen["held_polls"],
        rollover_requests=load.ok + load.failures,
        rollover_failed_requests=load.failures,
        rollover_failures=dict(load.failed),
        old_cache_bytes_left=old_bytes(),
        old_cache_nodes=len(old_paths),
        rollover_new_replicas=len(new_pods),
    )
    assert old_bytes() == 0
    assert load.failures == 0, dict(load.failed)
    assert gate_partial_ok, gate_seen
