"""The parts every install manifest is built from: the values (concrete, or Helm's
substitutions), object metadata, RBAC, the workload skeleton and the unprivileged pod
(``manifests``, ``manifests_gateway``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from warmfleet.api.names import LABEL_MANAGED_BY, MANAGER

Obj = dict[str, Any]
VERSION = "0.1.0"


@dataclass(frozen=True, slots=True)
class Values:
    namespace: str = "warmfleet-system"
    image: str = f"ghcr.io/warmfleet/warmfleet:{VERSION}"
    pull_policy: str = "IfNotPresent"
    watch_namespace: str = "default"
    host_path: str = "/opt/warmfleet/cache"


HELM = Values(
    namespace="{{ .Release.Namespace }}",
    image="{{ .Values.image.repository }}:{{ .Values.image.tag }}",
    pull_policy="{{ .Values.image.pullPolicy }}",
    watch_namespace="{{ .Values.operator.watchNamespace }}",
    host_path="{{ .Values.agent.hostPath }}",
)


def meta(name: str, v: Values, component: str, *, namespaced: bool = True) -> Obj:
    meta: Obj = {
        "name": name,
        "labels": {LABEL_MANAGED_BY: MANAGER, "app.kubernetes.io/component": component},
    }
    if namespaced:
        meta["namespace"] = v.namespace
    return meta


def rule(groups: list[str], resources: list[str], verbs: list[str]) -> Obj:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


def rbac(name: str, v: Values, component: str, rules: list[Obj]) -> list[Obj]:
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(name, v, component)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": meta(name, v, component, namespaced=False),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": meta(name, v, component, namespaced=False),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": v.namespace}],
        },
    ]


CRUD = ["get", "list", "watch", "create", "update", "patch", "delete"]
READ = ["get", "list", "watch"]


def resources(cpu: str, memory: str, memory_limit: str) -> Obj:
    """Requests, and a memory limit only (a CPU limit throttles a busy event loop)."""
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory_limit}}


def container(name: str, v: Values, args: list[str], resources: Obj, **fields: Any) -> Obj:
    """A container of the warmfleet image running ``warmfleet <args>``; ``fields`` in order."""
    return {
        "name": name,
        "image": v.image,
        "imagePullPolicy": v.pull_policy,
        "args": args,
        **fields,
        "resources": resources,
    }


def pod_labels(name: str) -> dict[str, str]:
    """The labels of workload ``name``'s pods (what its Service, policies and budget select)."""
    return {"app.kubernetes.io/name": name}


def http_probe(path: str, period_s: int, failures: int | None = None) -> Obj:
    """A probe that GETs ``path`` on the container's ``http`` port (2 s to answer)."""
    probe: Obj = {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period_s}
    if failures is not None:
        probe["failureThreshold"] = failures
    probe["timeoutSeconds"] = 2
    return probe


def scraped(port: int) -> Obj:
    """Pod annotations of the common ``prometheus.io/*`` convention (Prometheus's
    ``kubernetes-pods`` example job): scrape ``/metrics`` on ``port``."""
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
    }


def workload(
    kind: str,
    name: str,
    v: Values,
    component: str,
    pod: Obj,
    *,
    metrics_port: int | None = None,
    **spec: Any,
) -> Obj:
    """A Deployment or DaemonSet ``name`` whose pods (``pod``: their spec, less the service
    account) run as the service account ``name``, carry the label
    ``app.kubernetes.io/name: <name>`` and, with a ``metrics_port``, the annotations that get
    them scraped there; ``spec``: the fields before the selector."""
    labels = pod_labels(name)
    template: Obj = {"labels": labels}
    if metrics_port is not None:
        template["annotations"] = scraped(metrics_port)
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": meta(name, v, component),
        "spec": {
            **spec,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": template,
                "spec": {"serviceAccountName": name, **pod},
            },
        },
    }


# A user the image does not have: nothing in it is this user's, so the root file system can be
# read-only and the process can write only its empty /tmp.
UNPRIVILEGED_UID = 65532


def unprivileged(pod: Obj) -> Obj:
    """``pod`` (a pod spec) made to pass the Pod Security Standards' ``restricted`` profile: a
    non-root user, the runtime's seccomp profile, and in each container no privilege
    escalation, no capabilities and a read-only root file system with an empty ``/tmp``."""
    tmp = {"name": "tmp", "mountPath": "/tmp"}
    containers = [
        {
            **c,
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            },
            "volumeMounts": [*c.get("volumeMounts", []), tmp],
        }
        for c in pod["containers"]
    ]
    return {
        **pod,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": UNPRIVILEGED_UID,
            "runAsGroup": UNPRIVILEGED_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumes": [*pod.get("volumes", []), {"name": "tmp", "emptyDir": {}}],
        "containers": containers,
    }
