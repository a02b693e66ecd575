"""The parts every install manifest is built from: the values (concrete, or Helm's
substitutions), object metadata and RBAC (``manifests``, ``manifests_gateway``)."""

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
