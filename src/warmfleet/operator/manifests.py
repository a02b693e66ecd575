"""Install manifests: CRDs, RBAC, the operator, the node-agent DaemonSet and the gateway.

One set of builders renders both the plain manifests (deploy/manifests/warmfleet.yaml, concrete
values) and the Helm chart templates (deploy/helm/warmfleet/templates, where string fields are
``{{ .Values.* }}`` / ``{{ .Release.Namespace }}`` substitutions and nothing else), so the two
cannot drift. ``write_all`` regenerates deploy/ (``warmfleet fleet render``); a test checks the
committed files match.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from warmfleet.api.crds import all_crds
from warmfleet.api.names import LABEL_MANAGED_BY, MANAGER
from warmfleet.api.resources import API_VERSION

Obj = dict[str, Any]
VERSION = "0.1.0"
SYNC_PORT = 9470  # the gateway replicas' replica-sync port (catch-up on the next one)


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


def _meta(name: str, v: Values, component: str, *, namespaced: bool = True) -> Obj:
    meta: Obj = {
        "name": name,
        "labels": {LABEL_MANAGED_BY: MANAGER, "app.kubernetes.io/component": component},
    }
    if namespaced:
        meta["namespace"] = v.namespace
    return meta


def _rule(groups: list[str], resources: list[str], verbs: list[str]) -> Obj:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


def _rbac(name: str, v: Values, component: str, rules: list[Obj]) -> list[Obj]:
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, v, component)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(name, v, component, namespaced=False),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _meta(name, v, component, namespaced=False),
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


def operator_objects(v: Values) -> list[Obj]:
    rules = [
        _rule(["warmfleet.dev"], ["inferenceendpoints", "modelcaches", "imagecaches"], CRUD),
        _rule(
            ["warmfleet.dev"],
            ["inferenceendpoints/status", "modelcaches/status", "imagecaches/status"],
            ["get", "update", "patch"],
        ),
        _rule(["apps"], ["deployments", "daemonsets"], CRUD),
        _rule([""], ["services"], CRUD),
        _rule(["discovery.k8s.io"], ["endpointslices"], READ),  # the gateway pods to scrape
        _rule([""], ["pods"], [*READ, "patch"]),
        _rule([""], ["nodes"], [*READ, "patch"]),
        _rule([""], ["namespaces"], READ),
        _rule([""], ["events"], ["create", "patch"]),
        _rule(["events.k8s.io"], ["events"], ["create", "patch"]),
        _rule(["apiextensions.k8s.io"], ["customresourcedefinitions"], READ),
    ]
    labels = {"app.kubernetes.io/name": "warmfleet-operator"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta("warmfleet-operator", v, "operator"),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": "warmfleet-operator",
                    "containers": [
                        {
                            "name": "operator",
                            "image": v.image,
                            "imagePullPolicy": v.pull_policy,
                            "args": [
                                "fleet",
                                "operator",
                                "--namespace",
                                v.watch_namespace,
                                "--gateway-service",
                                f"{v.namespace}/warmfleet-gateway:http",
                            ],
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "128Mi"},
                                "limits": {"memory": "512Mi"},
                            },
                        }
                    ],
                },
            },
        },
    }
    return [*_rbac("warmfleet-operator", v, "operator", rules), deployment]


def agent_objects(v: Values) -> list[Obj]:
    """The node agent: fills the caches assigned in its Node's annotation, reports progress."""
    rules = [_rule([""], ["nodes"], [*READ, "patch"])]
    labels = {"app.kubernetes.io/name": "warmfleet-node-agent"}
    container = {
        "name": "agent",
        "image": v.image,
        "imagePullPolicy": v.pull_policy,
        "args": ["cache", "agent", "--config", "/etc/warmfleet/node.yaml"],
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "WARMFLEET_CACHE_ROOT", "value": "/cache"},
        ],
        "resources": {
            "requests": {"cpu": "200m", "memory": "256Mi"},
            "limits": {"memory": "1Gi"},
        },
        "volumeMounts": [
            {"name": "cache", "mountPath": "/cache"},
            {"name": "config", "mountPath": "/etc/warmfleet"},
        ],
    }
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta("warmfleet-node-agent", v, "node-agent"),
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": "warmfleet-node-agent",
                    "priorityClassName": "system-node-critical",
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [container],
                    "volumes": [
                        {
                            "name": "cache",
                            "hostPath": {"path": v.host_path, "type": "DirectoryOrCreate"},
                        },
                        {"name": "config", "configMap": {"name": "warmfleet-node-agent"}},
                    ],
                },
            },
        },
    }
    node_yaml = (
        "apiVersion: warmfleet.dev/v1alpha1\nkind: NodeCacheConfig\n"
        "spec:\n  root: /cache\n  capacity:\n    budget: 1TiB\n    reserve: 50GiB\n"
        f"  kubernetes:\n    hostPath: {v.host_path}\n"
    )
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta("warmfleet-node-agent", v, "node-agent"),
        "data": {"node.yaml": node_yaml},
    }
    return [*_rbac("warmfleet-node-agent", v, "node-agent", rules), config, daemonset]


def gateway_yaml(v: Values) -> str:
    """The gateway's configuration in its ConfigMap: one endpoint per ``InferenceEndpoint`` of
    the watched namespace (on the Services the operator creates), chosen by the OpenAI
    ``model``. The replicas share their routing state (docs/replicas.md): each one's peers are
    the ready pods of the gateway's own Service at its ``sync`` port. Edit the ConfigMap (or
    list endpoints by hand) to change it."""
    spec = {
        "listen": {"host": "0.0.0.0", "port": 8080},
        "inferenceEndpoints": {"namespace": v.watch_namespace},
        "modelSelectsEndpoint": True,
        "replicaSync": {
            "listen": {"host": "0.0.0.0", "port": SYNC_PORT},
            "peers": {"type": "kubernetes", "service": "warmfleet-gateway", "port": "sync"},
        },
    }
    doc = {"apiVersion": API_VERSION, "kind": "Gateway", "spec": spec}
    return yaml.safe_dump(doc, sort_keys=False)


def gateway_objects(v: Values) -> list[Obj]:
    """The gateway finds engine pods through the EndpointSlices of each endpoint's Service."""
    rules = [
        _rule(["discovery.k8s.io"], ["endpointslices"], READ),
        _rule([""], ["services", "pods"], READ),
        _rule(["warmfleet.dev"], ["inferenceendpoints"], READ),
    ]
    labels = {"app.kubernetes.io/name": "warmfleet-gateway"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta("warmfleet-gateway", v, "gateway"),
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": "warmfleet-gateway",
                    "volumes": [{"name": "config", "configMap": {"name": "warmfleet-gateway"}}],
                    "containers": [
                        {
                            "name": "gateway",
                            "image": v.image,
                            "imagePullPolicy": v.pull_policy,
                            "args": ["serve", "--config", "/etc/warmfleet/gateway.yaml"],
                            "ports": [
                                {"name": "http", "containerPort": 8080},
                                # replica sync: notes (PUB) and catch-up (the next port)
                                {"name": "sync", "containerPort": SYNC_PORT},
                                {"name": "sync-catch-up", "containerPort": SYNC_PORT + 1},
                            ],
                            # replicaSync.replicaId: the pod's name
                            "env": [
                                {
                                    "name": "POD_NAME",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                                }
                            ],
                            # Ready once this gateway can route (a health round done); not
                            # plain /ready, which is 503 while any endpoint has no healthy
                            # engine and would take every gateway pod out of the Service.
                            "readinessProbe": {
                                "httpGet": {"path": "/ready?scope=gateway", "port": "http"},
                                "periodSeconds": 5,
                                "failureThreshold": 2,
                                "timeoutSeconds": 2,
                            },
                            # /health answers from the event loop: a wedged loop is restarted.
                            "livenessProbe": {
                                "httpGet": {"path": "/health", "port": "http"},
                                "periodSeconds": 10,
                                "failureThreshold": 3,
                                "timeoutSeconds": 2,
                            },
                            "volumeMounts": [{"name": "config", "mountPath": "/etc/warmfleet"}],
                            "resources": {
                                "requests": {"cpu": "500m", "memory": "256Mi"},
                                "limits": {"memory": "1Gi"},
                            },
                        }
                    ],
                },
            },
        },
    }
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta("warmfleet-gateway", v, "gateway"),
        "data": {"gateway.yaml": gateway_yaml(v)},
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta("warmfleet-gateway", v, "gateway"),
        "spec": {
            "selector": labels,
            "ports": [
                {"name": "http", "port": 80, "targetPort": "http"},
                {"name": "sync", "port": SYNC_PORT, "targetPort": "sync"},
            ],
        },
    }
    objects = [config, deployment, service, _gateway_network_policy(v, labels)]
    return [*_rbac("warmfleet-gateway", v, "gateway", rules), *objects]


def _gateway_network_policy(v: Values, labels: dict[str, str]) -> Obj:
    """The replica-sync ports take connections from the gateway's own pods only (the sockets
    do not authenticate without ``curveSecretEnv``, docs/replicas.md); ``http`` from anyone.
    Enforced by CNIs that implement NetworkPolicy (Calico, Cilium, ...), ignored by others."""
    sync_ports = [{"protocol": "TCP", "port": name} for name in ("sync", "sync-catch-up")]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta("warmfleet-gateway", v, "gateway"),
        "spec": {
            "podSelector": {"matchLabels": labels},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"protocol": "TCP", "port": "http"}]},
                {"from": [{"podSelector": {"matchLabels": labels}}], "ports": sync_ports},
            ],
        },
    }


def install_objects(v: Values) -> list[Obj]:
    return [*operator_objects(v), *agent_objects(v), *gateway_objects(v)]


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (configuration files in ConfigMaps) as readable ``|`` blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(objects: list[Obj]) -> str:
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, width=100)


def _chart_files() -> dict[str, str]:
    chart = {
        "apiVersion": "v2",
        "name": "warmfleet",
        "description": "warmfleet fleet controller, node agent and gateway",
        "type": "application",
        "version": VERSION,
        "appVersion": VERSION,
    }
    values = {
        "image": {
            "repository": "ghcr.io/warmfleet/warmfleet",
            "tag": VERSION,
            "pullPolicy": "IfNotPresent",
        },
        "operator": {"watchNamespace": "default"},
        "agent": {"hostPath": "/opt/warmfleet/cache"},
    }
    files = {
        "Chart.yaml": yaml.safe_dump(chart, sort_keys=False),
        "values.yaml": yaml.safe_dump(values, sort_keys=False),
        "templates/operator.yaml": dump(operator_objects(HELM)),
        "templates/node-agent.yaml": dump(agent_objects(HELM)),
        "templates/gateway.yaml": dump(gateway_objects(HELM)),
    }
    for crd in all_crds():
        files[f"crds/{crd['metadata']['name']}.yaml"] = dump([crd])
    return files


def rendered_files() -> dict[str, str]:
    """Path (relative to deploy/) -> content, for every generated file."""
    files = {f"crds/{c['metadata']['name']}.yaml": dump([c]) for c in all_crds()}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": Values().namespace}}
    files["manifests/warmfleet.yaml"] = dump([namespace, *install_objects(Values())])
    files.update({f"helm/warmfleet/{k}": v for k, v in _chart_files().items()})
    return files


def write_all(deploy_dir: Path) -> list[Path]:
    written = []
    for rel, content in rendered_files().items():
        path = deploy_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        written.append(path)
    return written
