"""The gateway's install objects: its ConfigMap, Deployment, Service, RBAC, the NetworkPolicy
on its replica-sync ports and the Role that lets it make the fleet's CURVE key Secret."""

from __future__ import annotations

import yaml

from warmfleet.api.resources import API_VERSION
from warmfleet.operator.manifest_parts import (
    READ,
    Obj,
    Values,
    container,
    http_probe,
    meta,
    pod_labels,
    rbac,
    resources,
    rule,
    unprivileged,
    workload,
)

HTTP_PORT = 8080  # the OpenAI API, /metrics, the probes
SYNC_PORT = 9470  # the gateway replicas' replica-sync port (catch-up on the next one)
SYNC_KEY_SECRET = "warmfleet-gateway-sync"  # the replicas' CURVE key, made by the first one
NAME = "warmfleet-gateway"  # its Deployment, Service, ConfigMap, service account and pods' label


def gateway_yaml(v: Values) -> str:
    """The gateway's configuration in its ConfigMap: one endpoint per ``InferenceEndpoint`` of
    the watched namespace (on the Services the operator creates), chosen by the OpenAI
    ``model``. The replicas share their routing state (docs/replicas.md): each one's peers are
    the ready pods of the gateway's own Service at its ``sync`` port, and they authenticate
    and encrypt it with the CURVE key of the Secret ``SYNC_KEY_SECRET`` (the first replica
    makes it). Edit the ConfigMap (or list endpoints by hand) to change it."""
    spec = {
        "listen": {"host": "0.0.0.0", "port": HTTP_PORT},
        "inferenceEndpoints": {"namespace": v.watch_namespace},
        "modelSelectsEndpoint": True,
        "replicaSync": {
            "listen": {"host": "0.0.0.0", "port": SYNC_PORT},
            "peers": {"type": "kubernetes", "service": NAME, "port": "sync"},
            "curveSecret": {"name": SYNC_KEY_SECRET},
        },
    }
    doc = {"apiVersion": API_VERSION, "kind": "Gateway", "spec": spec}
    return yaml.safe_dump(doc, sort_keys=False)


def gateway_objects(v: Values) -> list[Obj]:
    """The gateway finds engine pods through the EndpointSlices of each endpoint's Service."""
    rules = [
        rule(["discovery.k8s.io"], ["endpointslices"], READ),
        rule([""], ["services", "pods"], READ),
        rule(["warmfleet.dev"], ["inferenceendpoints"], READ),
    ]
    labels = pod_labels(NAME)
    pod = unprivileged(
        {
            "affinity": _apart(labels),
            "volumes": [{"name": "config", "configMap": {"name": NAME}}],
            "containers": [_gateway_container(v)],
        }
    )
    deployment = workload("Deployment", NAME, v, "gateway", pod, metrics_port=HTTP_PORT, replicas=2)
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(NAME, v, "gateway"),
        "data": {"gateway.yaml": gateway_yaml(v)},
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(NAME, v, "gateway"),
        "spec": {
            "selector": labels,
            "ports": [
                {"name": "http", "port": 80, "targetPort": "http"},
                {"name": "sync", "port": SYNC_PORT, "targetPort": "sync"},
            ],
        },
    }
    objects = [config, deployment, service, _gateway_network_policy(v, labels)]
    return [*rbac(NAME, v, "gateway", rules), *_sync_key_role(v), *objects]


def _gateway_container(v: Values) -> Obj:
    ports = [
        {"name": "http", "containerPort": HTTP_PORT},
        # replica sync: notes (PUB) and catch-up (the next port)
        {"name": "sync", "containerPort": SYNC_PORT},
        {"name": "sync-catch-up", "containerPort": SYNC_PORT + 1},
    ]
    # replicaSync.replicaId: the pod's name
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    # Ready once this gateway can route (a health round done); not plain /ready, which is 503
    # while any endpoint has no healthy engine and would take every gateway pod out of the
    # Service.
    ready = http_probe("/ready?scope=gateway", period_s=5, failures=2)
    # /health answers from the event loop: a wedged loop is restarted.
    alive = http_probe("/health", period_s=10, failures=3)
    return container(
        "gateway",
        v,
        ["serve", "--config", "/etc/warmfleet/gateway.yaml"],
        resources("500m", "256Mi", "1Gi"),
        ports=ports,
        env=env,
        readinessProbe=ready,
        livenessProbe=alive,
        volumeMounts=[{"name": "config", "mountPath": "/etc/warmfleet"}],
    )


def _sync_key_role(v: Values) -> list[Obj]:
    """In the gateway's own namespace only: read the key's Secret, and create it (a create
    cannot be limited to a name in RBAC; no other Secret can be read)."""
    name = "warmfleet-gateway-sync-key"
    secrets = rule([""], ["secrets"], ["get"])
    secrets["resourceNames"] = [SYNC_KEY_SECRET]
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": meta(name, v, "gateway"),
        "rules": [secrets, rule([""], ["secrets"], ["create"])],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta(name, v, "gateway"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": v.namespace}],
    }
    return [role, binding]


def _apart(labels: dict[str, str]) -> Obj:
    """The replicas on different nodes where there are enough (a node's loss leaves one routing
    with the shared state), else together: preferred, never a pod left unscheduled."""
    term = {"labelSelector": {"matchLabels": labels}, "topologyKey": "kubernetes.io/hostname"}
    preferred = [{"weight": 100, "podAffinityTerm": term}]
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}


def _gateway_network_policy(v: Values, labels: dict[str, str]) -> Obj:
    """The replica-sync ports take connections from the gateway's own pods only (besides CURVE,
    which refuses a peer without the key but still takes its connection, docs/replicas.md);
    ``http`` from anyone. Enforced by CNIs that implement NetworkPolicy (Calico, Cilium, ...),
    ignored by others."""
    sync_ports = [{"protocol": "TCP", "port": name} for name in ("sync", "sync-catch-up")]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(NAME, v, "gateway"),
        "spec": {
            "podSelector": {"matchLabels": labels},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"protocol": "TCP", "port": "http"}]},
                {"from": [{"podSelector": {"matchLabels": labels}}], "ports": sync_ports},
            ],
        },
    }


def gateway_disruption_budget(v: Values) -> Obj:
    """At most one gateway replica evicted at a time (a node drain, a cluster upgrade): the
    other keeps serving, and the evicted one catches up from it when it returns. ``policy/v1``
    (Kubernetes 1.21 and later), so it is a file and a chart template of its own: the chart
    renders it only where the server serves that version."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(NAME, v, "gateway"),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": pod_labels(NAME)},
        },
    }
