"""Kubernetes objects the operator creates at run time (pure dict builders).

Contract with the node agent (the agent DaemonSet implements it; see docs/fleet-controller.md):
- the operator writes the caches a node must hold to the Node annotation ``ANN_ASSIGNED``
  (JSON list of {cache, uri, revision, hostPath});
- the agent writes what it holds to the Node annotation ``ANN_CACHE_STATUS``
  (JSON map cache -> {state, bytesDone, bytesTotal, healthy, message}).
Contract with the engine container: ``WARMFLEET_MODEL_DIR`` is the node-cache directory (use it
when ``$WARMFLEET_MODEL_DIR/.warmfleet-ready`` exists), else load ``WARMFLEET_MODEL_URI``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from warmfleet.api import names
from warmfleet.control.actions import DeploymentPlan, NodeCacheAssignment
from warmfleet.control.observed import DesiredEndpoint

ANN_ASSIGNED = names.ANN_ASSIGNED
ANN_CACHE_STATUS = names.ANN_CACHE_STATUS
ANN_CREATED = "warmfleet.dev/created-at"
ANN_SPEC_HASH = "warmfleet.dev/spec-hash"
ANN_MODEL_CACHE = "warmfleet.dev/model-cache"
ANN_IMAGE_CACHE = "warmfleet.dev/image-cache"
ANN_PREPARED = "warmfleet.dev/prepared"
LABEL_IMAGE_CACHE = "warmfleet.dev/image-cache"
LABEL_ROLE = "warmfleet.dev/role"
PULLER_HELPER_IMAGE = "busybox:1.36-musl"  # static binary, copied into the pinned image's pod
CACHE_MOUNT = "/warmfleet-cache"

Obj = dict[str, Any]


def owner_reference(kind: str, name: str, uid: str) -> Obj:
    return {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _affinity(plan: DeploymentPlan) -> Obj:
    terms = [
        {
            "weight": p.weight,
            "preference": {
                "matchExpressions": [
                    {"key": p.label, "operator": "In", "values": [names.READY_VALUE]}
                ]
            },
        }
        for p in plan.preferences
    ]
    return (
        {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": terms}}
        if terms
        else {}
    )


def _engine_container(plan: DeploymentPlan) -> Obj:
    env = [
        {"name": "WARMFLEET_MODEL_URI", "value": plan.model_source.uri},
        {"name": "WARMFLEET_MODEL_REVISION", "value": plan.model_source.revision},
    ]
    container: Obj = {
        "name": "engine",
        "image": plan.image,
        "args": list(plan.args),
        "ports": [{"name": "http", "containerPort": plan.port}],
        "env": env,
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5},
    }
    if plan.command:
        container["command"] = list(plan.command)
    if plan.model_cache is not None:
        env.append({"name": "WARMFLEET_MODEL_DIR", "value": f"{CACHE_MOUNT}/{plan.model_cache}"})
        container["volumeMounts"] = [
            {"name": "model-cache", "mountPath": CACHE_MOUNT, "readOnly": True}
        ]
    if plan.gpus_per_replica:
        gpus = str(plan.gpus_per_replica)
        container["resources"] = {
            "limits": {"nvidia.com/gpu": gpus},
            "requests": {"nvidia.com/gpu": gpus},
        }
    return container


# Parts of a Deployment that an update must leave exactly as rendered (a merge patch would
# keep a node-selector key, an affinity or a volume the new plan no longer has).
DEPLOYMENT_EXACT_PATHS: tuple[tuple[str, ...], ...] = tuple(
    ("spec", "template", "spec", key) for key in ("nodeSelector", "affinity", "volumes")
)


def deployment(plan: DeploymentPlan, namespace: str, owner_uid: str) -> Obj:
    labels = {
        names.LABEL_ENDPOINT: plan.endpoint,
        names.LABEL_VARIANT: plan.variant,
        names.LABEL_REVISION: plan.revision,
        names.LABEL_MANAGED_BY: names.MANAGER,
    }
    annotations = {
        ANN_SPEC_HASH: plan.spec_hash(),
        ANN_MODEL_CACHE: plan.model_cache or "",
        ANN_IMAGE_CACHE: plan.image_cache or "",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": plan.name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_reference("InferenceEndpoint", plan.endpoint, owner_uid)],
        },
        "spec": {
            "replicas": plan.replicas,
            "selector": {
                "matchLabels": {k: labels[k] for k in labels if k != names.LABEL_MANAGED_BY}
            },
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {
                    "maxSurge": plan.update_bounds[0],
                    "maxUnavailable": plan.update_bounds[1],
                },
            },
            "template": {
                "metadata": {
                    "labels": {**labels, LABEL_ROLE: "engine"},
                    "annotations": annotations,
                },
                "spec": _engine_pod(plan),
            },
        },
    }


def _engine_pod(plan: DeploymentPlan) -> Obj:
    """The engine pod's spec: its container, node selector, affinity for warm nodes, GPU
    toleration and, with a weights cache, the node's cache directory."""
    pod_spec: Obj = {
        "containers": [_engine_container(plan)],
        "nodeSelector": dict(plan.node_selector),
        "affinity": _affinity(plan),
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if plan.model_cache is not None and plan.host_path is not None:
        pod_spec["volumes"] = [
            {
                "name": "model-cache",
                "hostPath": {"path": plan.host_path, "type": "DirectoryOrCreate"},
            }
        ]
    return pod_spec


def service(
    endpoint: str, port: int, namespace: str, owner_uid: str, variant: str | None = None
) -> Obj:
    """The Service of an endpoint's engines (``variant`` ``None``: every variant's), named
    ``<endpoint>`` or ``<endpoint>-<variant>``. A gateway variant with ``discovery: {type:
    kubernetes, service: <endpoint>-<variant>}`` follows the latter's EndpointSlices."""
    labels = {names.LABEL_ENDPOINT: endpoint, names.LABEL_MANAGED_BY: names.MANAGER}
    selector = {names.LABEL_ENDPOINT: endpoint, LABEL_ROLE: "engine"}
    if variant is not None:
        labels[names.LABEL_VARIANT] = variant
        selector[names.LABEL_VARIANT] = variant
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names.service_name(endpoint, variant),
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner_reference("InferenceEndpoint", endpoint, owner_uid)],
        },
        "spec": {
            "selector": selector,
            "ports": [{"name": "http", "port": port, "targetPort": "http"}],
        },
    }


def cache_object(
    kind: str,
    name: str,
    namespace: str,
    spec: Obj,
    *,
    now_s: float,
    owner: DesiredEndpoint | None = None,
) -> Obj:
    """A ModelCache or ImageCache (``kind``) as created, stamped with its creation time (what
    the weights gate's timeout counts from); ``owner``: the endpoint that controls it."""
    meta: Obj = {
        "name": name,
        "namespace": namespace,
        "labels": {names.LABEL_MANAGED_BY: names.MANAGER},
        "annotations": {ANN_CREATED: f"{now_s:.3f}"},
    }
    if owner is not None:
        meta["ownerReferences"] = [owner_reference(names.ENDPOINT_KIND, owner.name, owner.uid)]
    return {"apiVersion": "warmfleet.dev/v1alpha1", "kind": kind, "metadata": meta, "spec": spec}


def image_puller(cache: str, image: str, node_selector: dict[str, str], namespace: str) -> Obj:
    """A DaemonSet that keeps ``image`` pulled *and in use* on every matching node.

    The image's own entrypoint is not run: an init container copies a static busybox into an
    emptyDir and the pinned container runs it as ``sleep`` (so any image works, and kubelet image
    GC never removes an image a running container uses).
    """
    labels = {LABEL_IMAGE_CACHE: cache, names.LABEL_MANAGED_BY: names.MANAGER}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": names.puller_name(cache), "namespace": namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {LABEL_IMAGE_CACHE: cache}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": dict(node_selector),
                    "tolerations": [{"operator": "Exists"}],
                    "terminationGracePeriodSeconds": 1,
                    "initContainers": [
                        {
                            "name": "sleeper",
                            "image": PULLER_HELPER_IMAGE,
                            "command": ["cp", "/bin/busybox", "/wf/sleep"],
                            "volumeMounts": [{"name": "wf", "mountPath": "/wf"}],
                        }
                    ],
                    "containers": [
                        {
                            "name": "pin",
                            "image": image,
                            "command": ["/wf/sleep", "2147483647"],
                            "resources": {
                                "requests": {"cpu": "1m", "memory": "8Mi"},
                                "limits": {"memory": "16Mi"},
                            },
                            "volumeMounts": [{"name": "wf", "mountPath": "/wf"}],
                        }
                    ],
                    "volumes": [{"name": "wf", "emptyDir": {}}],
                },
            },
        },
    }


def assignments(caches: Sequence[NodeCacheAssignment]) -> str:
    """The value of ``ANN_ASSIGNED``: the caches a node must hold (``agent.kube_node`` reads it)."""
    value = [
        {
            "cache": a.cache,
            "uri": a.source.uri,
            "revision": a.source.revision,
            "hostPath": a.host_path,
        }
        for a in caches
    ]
    return json.dumps(value, sort_keys=True)
