"""The project's deploy/ tree against a real kube-apiserver (v1.20.2): CRDs established, every
example accepted, invalid documents rejected by the server naming the field, RBAC applied and in
force. Opt-in: ``make k8s-e2e``."""

from __future__ import annotations

import asyncio
import base64
import copy
from collections.abc import Callable
from typing import Any

import helm_python as helm
import pytest
import yaml

from k8s.controlplane import ControlPlane
from k8s.k8s_results import DEPLOY, ENABLED, SKIP_REASON, Results, documents
from k8s.serviceaccounts import service_account_kubeconfig
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.replica_sync.config import CurveSecretRef, ReplicaSyncConfig
from warmfleet.gateway.replica_sync.curve import CurveKey
from warmfleet.gateway.replica_sync.curve_secret import fleet_curve_key

pytestmark = [pytest.mark.k8s, pytest.mark.skipif(not ENABLED, reason=SKIP_REASON)]

GROUP = "/apis/warmfleet.dev/v1alpha1/namespaces/default"
Obj = dict[str, Any]


def test_server_version(control_plane: ControlPlane) -> None:
    assert control_plane.get_json("/version")["gitVersion"] == "v1.20.2"


def test_crds_established(crds: int) -> None:
    assert crds == 3


def test_valid_examples_accepted(
    control_plane: ControlPlane, crds: int, rbac: list[Obj], results: Results
) -> None:
    examples = sorted(DEPLOY.glob("examples/*.yaml"))
    total = sum(len(documents(f)) for f in examples)
    accepted = 0
    for path in examples:
        out = control_plane.kubectl(
            "apply", "--dry-run=server", "--validate=false", "-o", "json", "-f", str(path)
        )
        answer = yaml.safe_load(out.stdout)
        items = answer["items"] if answer.get("kind") == "List" else [answer]
        accepted += len(items)
        for item in items:
            if item["kind"] == "InferenceEndpoint":  # defaults filled by the server's schema
                assert item["spec"]["variants"][0]["trafficWeight"] == 1
                assert item["spec"]["modelCacheConfig"]["weightsCache"]["gate"]["mode"]
    results.record(valid_examples_accepted=accepted, valid_examples_total=total)
    assert total >= 1
    assert accepted == total


def endpoint() -> Obj:
    return {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "InferenceEndpoint",
        "metadata": {"name": "bad", "namespace": "default"},
        "spec": {
            "modelSource": {"uri": "s3://models/m/", "revision": "r1"},
            "image": "engine:1",
            "port": 8000,
            "variants": [{"name": "main", "replicas": 1}],
        },
    }


def model_cache() -> Obj:
    return {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "ModelCache",
        "metadata": {"name": "bad", "namespace": "default"},
        "spec": {"modelSource": {"uri": "s3://models/m/"}, "owner": "e"},
    }


def image_cache() -> Obj:
    return {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "ImageCache",
        "metadata": {"name": "bad", "namespace": "default"},
        "spec": {"image": "engine:1", "parentReferences": [{"name": "e"}]},
    }


def mutate(base: Callable[[], Obj], change: Callable[[Obj], object]) -> Obj:
    doc = copy.deepcopy(base())
    change(doc)
    return doc


def set_gate(doc: Obj, **values: object) -> None:
    cache = doc["spec"].setdefault("modelCacheConfig", {}).setdefault("weightsCache", {})
    cache["enabled"] = True
    cache["gate"] = values


# (case, document, the field the server's message must name; 1.20 names list items without
# an index: spec.variants.name)
INVALID: list[tuple[str, Callable[[], Obj], str]] = [
    (
        "port above 65535",
        lambda: mutate(endpoint, lambda d: d["spec"].update(port=70000)),
        "spec.port",
    ),
    (
        "port as a string",
        lambda: mutate(endpoint, lambda d: d["spec"].update(port="http")),
        "spec.port",
    ),
    (
        "negative gpusPerReplica",
        lambda: mutate(endpoint, lambda d: d["spec"].update(gpusPerReplica=-1)),
        "spec.gpusPerReplica",
    ),
    ("empty image", lambda: mutate(endpoint, lambda d: d["spec"].update(image="")), "spec.image"),
    (
        "modelSource without uri",
        lambda: mutate(endpoint, lambda d: d["spec"]["modelSource"].pop("uri")),
        "spec.modelSource.uri",
    ),
    (
        "no variants",
        lambda: mutate(endpoint, lambda d: d["spec"].update(variants=[])),
        "spec.variants",
    ),
    (
        "variant without name",
        lambda: mutate(endpoint, lambda d: d["spec"]["variants"][0].pop("name")),
        "spec.variants.name",
    ),
    (
        "negative replicas",
        lambda: mutate(endpoint, lambda d: d["spec"]["variants"][0].update(replicas=-1)),
        "spec.variants.replicas",
    ),
    (
        "gate mode not in the enum",
        lambda: mutate(endpoint, lambda d: set_gate(d, mode="sometimes")),
        "spec.modelCacheConfig.weightsCache.gate.mode",
    ),
    (
        "gate minReadyPercent 0 (exclusive minimum)",
        lambda: mutate(endpoint, lambda d: set_gate(d, mode="minReady", minReadyPercent=0)),
        "spec.modelCacheConfig.weightsCache.gate.minReadyPercent",
    ),
    (
        "rollout type not in the enum",
        lambda: mutate(endpoint, lambda d: d["spec"].update(rollout={"type": "Canary"})),
        "spec.rollout.type",
    ),
    (
        "autoscaling tolerance 1 (exclusive maximum)",
        lambda: mutate(
            endpoint,
            lambda d: d["spec"]["variants"][0].update(
                autoscaling={"enabled": True, "tolerance": 1.0}
            ),
        ),
        "spec.variants.autoscaling.tolerance",
    ),
    (
        "routing key mode not in the enum",
        lambda: mutate(
            endpoint, lambda d: d["spec"]["variants"][0].update(routing={"key": {"mode": "words"}})
        ),
        "spec.variants.routing.key.mode",
    ),
    ("endpoint without spec", lambda: mutate(endpoint, lambda d: d.pop("spec")), "spec"),
    (
        "model cache without owner",
        lambda: mutate(model_cache, lambda d: d["spec"].pop("owner")),
        "spec.owner",
    ),
    (
        "model cache with an empty hostPath",
        lambda: mutate(model_cache, lambda d: d["spec"].update(hostPath="")),
        "spec.hostPath",
    ),
    (
        "model cache with negative sizeBytes",
        lambda: mutate(model_cache, lambda d: d["spec"]["modelSource"].update(sizeBytes=-5)),
        "spec.modelSource.sizeBytes",
    ),
    (
        "image cache without image",
        lambda: mutate(image_cache, lambda d: d["spec"].pop("image")),
        "spec.image",
    ),
    (
        "image cache parent without name",
        lambda: mutate(image_cache, lambda d: d["spec"]["parentReferences"][0].pop("name")),
        "spec.parentReferences.name",
    ),
    (
        "image cache nodeSelector value not a string",
        lambda: mutate(image_cache, lambda d: d["spec"].update(nodeSelector={"zone": 3})),
        "spec.nodeSelector.zone",
    ),
]

PLURALS = {
    "InferenceEndpoint": "inferenceendpoints",
    "ModelCache": "modelcaches",
    "ImageCache": "imagecaches",
}


def test_invalid_rejected(control_plane: ControlPlane, crds: int, results: Results) -> None:
    rejected: list[dict[str, str]] = []
    wrong: list[str] = []
    for case, make, field in INVALID:
        doc = make()
        status, body = control_plane.request(
            "POST", f"{GROUP}/{PLURALS[doc['kind']]}?dryRun=All", doc
        )
        message = body.get("message", "") if isinstance(body, dict) else str(body)
        if status in (400, 422) and f"{field}: " in message:
            rejected.append({"case": case, "kind": doc["kind"], "message": message[:300]})
        else:
            wrong.append(f"{case}: HTTP {status}: {message[:300]}")
    results.record(invalid_rejected=len(rejected), invalid_rejected_cases=rejected)
    assert not wrong, wrong
    assert len(rejected) >= 10


def can_i_failures(
    control_plane: ControlPlane, checks: list[tuple[str, list[str], bool]]
) -> list[str]:
    """The ``(user, kubectl auth can-i args, allowed)`` checks the server answers otherwise."""
    failed = []
    for user, args, expected in checks:
        out = control_plane.kubectl("auth", "can-i", "--as", user, *args, check=False)
        if (out.stdout.strip() == "yes") != expected:
            failed.append(f"{user} {' '.join(args)}: {out.stdout.strip()} {out.stderr.strip()}")
    return failed


def test_rbac_in_force(
    control_plane: ControlPlane, crds: int, rbac: list[Obj], results: Results
) -> None:
    """The service accounts of deploy/manifests may do what they need and not more."""
    operator = "system:serviceaccount:warmfleet-system:warmfleet-operator"
    gateway = "system:serviceaccount:warmfleet-system:warmfleet-gateway"
    checks = [
        (operator, ["patch", "inferenceendpoints.warmfleet.dev", "--subresource=status"], True),
        (operator, ["create", "deployments.apps", "-n", "default"], True),
        (operator, ["delete", "modelcaches.warmfleet.dev", "-n", "default"], True),
        (operator, ["delete", "nodes"], False),
        (gateway, ["list", "endpointslices.discovery.k8s.io", "-n", "default"], True),
        (gateway, ["watch", "services", "-n", "default"], True),  # a derived variant's owner
        (gateway, ["create", "deployments.apps", "-n", "default"], False),
    ]
    failed = can_i_failures(control_plane, checks)
    results.record(rbac_applied=not failed, rbac_checks=len(checks))
    assert not failed, failed


def test_gateway_replicas_make_and_share_one_sync_key(
    control_plane: ControlPlane, crds: int, rbac: list[Obj], results: Results
) -> None:
    """The installed gateway's CURVE key (``replicaSync.curveSecret`` of its ConfigMap): two
    replicas starting together, as the gateway's service account with the manifests' Role, make
    one Secret and hold the same key; that account may read that Secret and no other."""
    (config_map,) = [
        o for o in rbac if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "warmfleet-gateway"
    ]
    installed = parse_gateway_config(yaml.safe_load(config_map["data"]["gateway.yaml"]))
    assert installed.spec.replica_sync is not None
    wanted = installed.spec.replica_sync.curve_secret
    assert wanted is not None
    namespace = "warmfleet-system"
    kubeconfig = service_account_kubeconfig(control_plane, "warmfleet-gateway", namespace)
    ref = CurveSecretRef.model_validate(
        {
            "name": wanted.name,
            "key": wanted.key,
            "namespace": namespace,
            "kubeconfig": str(kubeconfig),
        }
    )
    sync = ReplicaSyncConfig(curve_secret=ref)

    async def two_replicas() -> list[CurveKey | None]:
        return list(await asyncio.gather(fleet_curve_key(sync), fleet_curve_key(sync)))

    first, second = asyncio.run(two_replicas())
    assert first is not None
    assert first == second
    stored = control_plane.get_json(f"/api/v1/namespaces/{namespace}/secrets/{ref.name}")
    text = base64.b64decode(stored["data"][ref.key]).decode()
    assert CurveKey.from_secret(text, "the stored key") == first
    gateway = f"system:serviceaccount:{namespace}:warmfleet-gateway"
    checks = [
        (gateway, ["get", f"secrets/{ref.name}", "-n", namespace], True),
        (gateway, ["create", "secrets", "-n", namespace], True),
        (gateway, ["get", "secrets/warmfleet-operator-token", "-n", namespace], False),
        (gateway, ["list", "secrets", "-n", namespace], False),
        (gateway, ["create", "secrets", "-n", "default"], False),
    ]
    failed = can_i_failures(control_plane, checks)
    results.record(sync_key_shared=True, sync_key_rbac_checks=len(checks))
    assert not failed, failed


WORKLOAD_KINDS = {"Deployment", "DaemonSet", "Service"}


def test_helm_chart_applied(
    control_plane: ControlPlane, crds: int, rbac: list[Obj], results: Results
) -> None:
    """The chart as Helm itself renders it (its Go SDK, helm-python-sdk) is accepted by the server:
    its CRDs and every object as a server-side dry run, then every object for real (they carry
    the same names as deploy/manifests'); the workloads are deleted again at once (no node
    exists yet, so no pod of theirs was scheduled). helm-python-sdk renders for Helm's default
    capabilities, not this server's: what Helm would leave out here (its only guarded template,
    the ``policy/v1`` disruption budget, which 1.20 does not serve) is left out by the same
    test, ``.Capabilities.APIVersions.Has``, on the server's own list."""
    with helm.Chart.load(str(DEPLOY / "helm" / "warmfleet")) as chart:
        rendered = chart.render({}, name="warmfleet", namespace="warmfleet-system")
        chart_crds = [crd["data"] for crd in chart.crds]
    served = set(control_plane.kubectl("api-versions").stdout.split())
    rendered_objects = [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]
    objects = [o for o in rendered_objects if o["apiVersion"] in served]
    left_out = [o["kind"] for o in rendered_objects if o["apiVersion"] not in served]
    assert left_out == ([] if "policy/v1" in served else ["PodDisruptionBudget"])
    for crd in chart_crds:
        control_plane.kubectl("apply", "--dry-run=server", "-f", "-", stdin=crd)
    stream = yaml.safe_dump_all(objects)
    control_plane.kubectl("apply", "--dry-run=server", "-f", "-", stdin=stream)
    control_plane.kubectl("apply", "-f", "-", stdin=stream)
    found = control_plane.kubectl("get", "-f", "-", "-o", "name", stdin=stream).stdout.split()
    workloads = yaml.safe_dump_all([o for o in objects if o["kind"] in WORKLOAD_KINDS])
    control_plane.kubectl("delete", "--wait=false", "-f", "-", stdin=workloads)
    results.record(helm_applied=len(found) == len(objects), helm_objects=len(objects))
    assert len(found) == len(objects)
    assert len(chart_crds) == 3
