"""The operator, out of cluster, against a real Kubernetes v1.20.2 control plane.

The operator runs as ``warmfleet fleet operator --kubeconfig`` with the token of the
``warmfleet-operator`` service account of deploy/manifests (so its RBAC is what is tested). The
real controller-manager turns its Deployments into ReplicaSets and pods, the real scheduler binds
them to the stub kubelet's nodes, the stub kubelet runs each pod's command (the emulated engine)
on a loopback address, the real EndpointSlice controller publishes the ready pods in
``discovery.k8s.io/v1beta1`` slices, and a gateway (with the ``warmfleet-gateway`` service
account) discovers them. Opt-in: ``make k8s-e2e``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from k8s.controlplane import ControlPlane
from k8s.endpoints import emulator_args, inference_endpoint
from k8s.k8s_results import ENABLED, LOG_DIR, SKIP_REASON, Results
from k8s.kubelet_stub import StubKubelet, register_node, wait_for
from k8s.procs import CLI, Gateway, Proc, serve_gateway, start_gateway, start_operator
from k8s.serviceaccounts import service_account_kubeconfig
from k8s.sync_replicas import (
    SERVICE,
    create_service,
    publish,
    start_replica,
    sync_figures,
    sync_ports,
    turn,
)

pytestmark = [pytest.mark.k8s, pytest.mark.skipif(not ENABLED, reason=SKIP_REASON)]

NS = "default"
NODES = ["wf-node-1", "wf-node-2"]
ENGINE_PORT = 8000
API = "/apis/warmfleet.dev/v1alpha1/namespaces"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def kubelet(control_plane: ControlPlane, crds: int) -> Iterator[StubKubelet]:
    for i, name in enumerate(NODES):
        register_node(control_plane, name, f"127.0.0.{11 + i}")
    stub = StubKubelet(control_plane, NODES, LOG_DIR)
    stub.start()
    try:
        yield stub
    finally:
        stub.stop()


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, rbac: list[Obj], kubelet: StubKubelet, results: Results
) -> Iterator[Proc]:
    proc = start_operator(control_plane, NS)
    try:
        results.record(operator_out_of_cluster=True)
        yield proc
    finally:
        proc.stop()


def endpoint(name: str, *, replicas: int, image: str = "engine:1") -> Obj:
    return inference_endpoint(
        name,
        NS,
        replicas=replicas,
        image=image,
        port=ENGINE_PORT,
        command=CLI,
        args=emulator_args(name, ENGINE_PORT),
        modelCacheConfig={"weightsCache": {"enabled": True, "gate": {"mode": "none"}}},
    )


def get(plane: ControlPlane, path: str) -> Obj | None:
    status, body = plane.request("GET", path)
    if status == 404:
        return None
    assert status == 200, body
    found: Obj = body
    return found


def items(plane: ControlPlane, path: str) -> list[Obj]:
    listing = get(plane, path)
    return [] if listing is None else list(listing["items"])


def create(plane: ControlPlane, path: str, body: Obj) -> Obj:
    status, answer = plane.request("POST", path, body)
    assert status == 201, answer
    created: Obj = answer
    return created


def pods_of(plane: ControlPlane, endpoint_name: str) -> list[Obj]:
    selector = urllib.parse.quote(f"warmfleet.dev/endpoint={endpoint_name}")
    return items(plane, f"/api/v1/namespaces/{NS}/pods?labelSelector={selector}")


def test_operator_writes_status_through_the_subresource(
    control_plane: ControlPlane, operator: Proc, results: Results
) -> None:
    create(control_plane, f"{API}/{NS}/inferenceendpoints", endpoint("alpha", replicas=2))
    path = f"{API}/{NS}/inferenceendpoints/alpha"

    def phase() -> str | None:
        obj = get(control_plane, path) or {}
        value = (obj.get("status") or {}).get("phase")
        return str(value) if value else None

    first = wait_for("the operator's status on alpha", phase)
    # the CRD has a status subresource: a write of the main resource leaves status alone, so
    # the status present was written through /status
    status, _ = control_plane.request("PATCH", path, {"status": {"phase": "Deleting"}})
    assert status == 200
    assert phase() != "Deleting"
    caches = items(control_plane, f"{API}/{NS}/modelcaches")
    owned = [c for c in caches if (c["metadata"].get("ownerReferences") or [{}])[0].get("name")
             == "alpha"]  # fmt: skip
    results.record(status_subresource_ok=True, status_phase_seen=first, model_caches=len(owned))
    assert owned


def test_gateway_discovers_the_pods_through_real_endpointslices(
    control_plane: ControlPlane, operator: Proc, kubelet: StubKubelet, results: Results
) -> None:
    def ready_pods() -> list[Obj] | None:
        pods = pods_of(control_plane, "alpha")
        ok = [
            p for p in pods
            if p["spec"].get("nodeName") in NODES
            and any(c["type"] == "Ready" and c["status"] == "True"
                    for c in (p.get("status") or {}).get("conditions") or [])
        ]  # fmt: skip
        return ok if len(ok) == 2 else None

    pods = wait_for("2 ready pods of alpha (scheduled, run by the stub kubelet)", ready_pods, 90)
    served = control_plane.get_json("/apis/discovery.k8s.io")
    versions = [v["version"] for v in served["versions"]]
    selector = urllib.parse.quote("kubernetes.io/service-name=alpha-main")
    slices_path = f"/apis/discovery.k8s.io/v1beta1/namespaces/{NS}/endpointslices"

    def slice_ready() -> bool:
        slices = items(control_plane, f"{slices_path}?labelSelector={selector}")
        ready = [e for s in slices for e in s.get("endpoints") or []
                 if (e.get("conditions") or {}).get("ready")]  # fmt: skip
        return len(ready) == 2

    wait_for("the EndpointSlice controller's 2 ready endpoints", slice_ready)
    gateway = start_gateway(control_plane, "alpha", "alpha-main", NS)
    try:
        seen = wait_for(
            "requests through the gateway to reach both pods",
            all_pods_answer(gateway.url, {p["metadata"]["name"] for p in pods}),
            60,
        )
    finally:
        gateway.stop()
    results.record(
        endpointslice_versions_served=versions,
        gateway_discovered_instances=len(seen),
        pod_ready_after_s=[round(r.ready_after_s or 0, 1) for r in kubelet.pods.values()],
    )
    assert "v1" not in versions  # 1.20: the gateway had to pick v1beta1 by discovery


def test_gateway_follows_the_inference_endpoints(
    control_plane: ControlPlane, operator: Proc, results: Results
) -> None:
    """deploy/examples' gateway configuration: one gateway endpoint per InferenceEndpoint of the
    namespace, the request's ``model`` picking it, its instances from the variant's Service."""
    kubeconfig = service_account_kubeconfig(control_plane, "warmfleet-gateway")
    source = {"namespace": NS, "port": "http", "kubeconfig": str(kubeconfig)}
    spec = {"inferenceEndpoints": source, "modelSelectsEndpoint": True}
    gateway = serve_gateway("inference-endpoints", spec)
    pods = {p["metadata"]["name"] for p in pods_of(control_plane, "alpha")}
    try:
        seen = wait_for(
            "a request for model alpha served by one of its pods",
            lambda: answered_by(gateway.url, pods),
            60,
        )
    finally:
        gateway.stop()
    results.record(gateway_inference_endpoints_ok=seen in pods)


def test_gateway_replicas_find_each_other_through_their_services_endpointslices(
    control_plane: ControlPlane, operator: Proc, results: Results
) -> None:
    """Two replicas with ``replicaSync.peers: {type: kubernetes}`` (sync_replicas.py): each
    subscribes to the other through their Service's slices, leaving itself out by its pod name
    (one of 71 characters);
    a conversation's next turn reaching the other replica goes to the instance its first turn
    warmed, as a prefix hit (a replica that had not heard of it would have had no match); a
    replica whose slice goes is dropped by the other."""
    pods = {p["metadata"]["name"] for p in pods_of(control_plane, "alpha")}
    create_service(control_plane, NS)
    long_name = "gw-1-" + "x" * 66  # over 63 characters: its instance id is cut and hashed
    ports = {"gw-0": sync_ports()}
    while abs((second := sync_ports()) - ports["gw-0"]) < 2:
        pass
    ports[long_name] = second
    slices = {pod: publish(control_plane, NS, pod, port) for pod, port in ports.items()}
    replicas: dict[str, Gateway] = {}
    try:
        for pod, port in ports.items():
            replicas[pod] = start_replica(control_plane, NS, pod, port, "alpha")
            wait_for(f"{pod} answering", _answers(replicas[pod].url, pods), 60)
        first, other = replicas["gw-0"].url, replicas[long_name].url
        for url in (first, other):
            wait_for("one peer, heard", _sync_is(url, "peers_connected", 1))
            assert _sync_is(url, "peers", 1)()  # itself left out, long name too (before: 2)
        heard = (sync_figures(other) or {})["notes_received_total"]
        turns = []
        for n in range(4):
            user = {"role": "user", "content": f"conversation {n}: " + "tell me more. " * 90}
            instance, _reason, reply = turn(first, "alpha", [user])
            turns.append((instance, [user, {"role": "assistant", "content": reply}]))
        # a routing and an end a turn
        wait_for("gw-0's notes at gw-1", _sync_is(other, "notes_received_total", heard + 8))
        for instance, history in turns:
            follow = {"role": "user", "content": "and then?"}
            assert turn(other, "alpha", [*history, follow])[:2] == (instance, "prefix_hit")
        control_plane.request("DELETE", slices[long_name])
        wait_for("gw-0 to drop the other", _sync_is(first, "peers", 0))
    finally:
        for replica in replicas.values():
            replica.stop()
        for path in slices.values():
            control_plane.request("DELETE", path)
        control_plane.request("DELETE", f"/api/v1/namespaces/{NS}/services/{SERVICE}")
    results.record(replica_sync_endpointslice_peers=True, replica_sync_cross_replica_hits=4)


def _answers(url: str, pods: set[str]) -> Callable[[], str | None]:
    return lambda: answered_by(url, pods)


def _sync_is(url: str, name: str, value: float) -> Callable[[], bool]:
    """A probe: the replica's ``warmfleet_gateway_replica_sync_<name>`` is ``value`` (a
    counter: at least ``value``)."""

    def probe() -> bool:
        found = (sync_figures(url) or {}).get(name)
        return found is not None and (found >= value if name.endswith("_total") else found == value)

    return probe


def answered_by(url: str, pods: set[str]) -> str | None:
    body = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            resp.read()
            instance = resp.headers.get("x-warmfleet-instance")
    except (urllib.error.URLError, OSError):
        return None
    return instance if instance in pods else None


def all_pods_answer(url: str, pods: set[str]) -> Callable[[], set[str] | None]:
    """A probe for ``wait_for``: each call sends one request; truthy once every pod answered."""
    answered: set[str] = set()

    def probe() -> set[str] | None:
        instance = answered_by(url, pods)
        if instance is not None:
            answered.add(instance)
        return set(answered) if answered == pods else None

    return probe


KINDS = {
    "Deployment": f"/apis/apps/v1/namespaces/{NS}/deployments",
    "ReplicaSet": f"/apis/apps/v1/namespaces/{NS}/replicasets",
    "Pod": f"/api/v1/namespaces/{NS}/pods",
    "Service": f"/api/v1/namespaces/{NS}/services",
    "ModelCache": f"{API}/{NS}/modelcaches",
}


def children(plane: ControlPlane, uid: str) -> dict[str, dict[str, str]]:
    """Everything owned, directly or through owners, by the object ``uid``: kind -> uid -> name."""
    objects = [(kind, o) for kind, path in KINDS.items() for o in items(plane, path)]
    owners = {uid}
    found: dict[str, dict[str, str]] = {}
    changed = True
    while changed:
        changed = False
        for kind, obj in objects:
            meta = obj["metadata"]
            refs = {r["uid"] for r in meta.get("ownerReferences") or []}
            if refs & owners and meta["uid"] not in owners:
                owners.add(meta["uid"])
                found.setdefault(kind, {})[meta["uid"]] = meta["name"]
                changed = True
    return found


def still_there(plane: ControlPlane, found: dict[str, dict[str, str]]) -> list[str]:
    """Which of ``found`` still exist (the same uid: not a successor with the same name)."""
    left = []
    for kind, objects in found.items():
        for uid, name in objects.items():
            obj = get(plane, f"{KINDS[kind]}/{name}")
            if obj is not None and obj["metadata"]["uid"] == uid:
                left.append(f"{kind}/{name}")
    return left


def test_garbage_collector_removes_the_children(
    control_plane: ControlPlane, operator: Proc, kubelet: StubKubelet, results: Results
) -> None:
    """With the operator stopped and its finalizer removed (as an admin would), deleting the
    InferenceEndpoint leaves its children to the real garbage collector: the Deployment, its
    ReplicaSet and pods (the stub kubelet completes their termination), the Services and the
    ModelCache, all found through ownerReferences."""
    path = f"{API}/{NS}/inferenceendpoints/alpha"
    uid = (get(control_plane, path) or {})["metadata"]["uid"]
    kinds = {"Deployment", "ReplicaSet", "Pod", "Service", "ModelCache"}

    def all_children() -> dict[str, dict[str, str]] | None:
        found = children(control_plane, uid)
        return found if kinds <= found.keys() else None

    before = wait_for("alpha's Deployment, ReplicaSet, pods, Services and ModelCache", all_children)
    operator.stop()
    status, body = control_plane.request("PATCH", path, {"metadata": {"finalizers": None}})
    assert status == 200, body
    status, body = control_plane.request("DELETE", path)
    assert status == 200, body
    t0 = time.monotonic()

    def collected() -> bool:
        return get(control_plane, path) is None and not still_there(control_plane, before)

    wait_for("the garbage collector to remove alpha's children", collected, 90)
    results.record(
        gc_children_deleted=True,
        gc_children={kind: sorted(objects.values()) for kind, objects in before.items()},
        gc_seconds=round(time.monotonic() - t0, 1),
        pods_finalized_by_stub_kubelet=len(kubelet.finalized),
        stub_kubelet_errors=kubelet.errors[:5],
    )
