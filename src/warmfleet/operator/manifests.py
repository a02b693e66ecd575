"""Install manifests: CRDs, RBAC, the operator, the node-agent DaemonSet and the gateway.

One set of builders renders both the plain manifests (deploy/manifests/warmfleet.yaml, concrete
values) and the Helm chart templates (deploy/helm/warmfleet/templates, where string fields are
``{{ .Values.* }}`` / ``{{ .Release.Namespace }}`` substitutions and nothing else), so the two
cannot drift. One exception: the gateway's PodDisruptionBudget (``policy/v1``, Kubernetes 1.21
and later) is a plain file of its own and a template rendered only where the server serves it.
``write_all`` regenerates deploy/ (``warmfleet fleet render``); a test checks the committed
files match.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from warmfleet.api.crds import all_crds
from warmfleet.operator.manifest_parts import (
    CRUD,
    HELM,
    READ,
    VERSION,
    Obj,
    Values,
    container,
    http_probe,
    meta,
    rbac,
    resources,
    rule,
    unprivileged,
    workload,
)
from warmfleet.operator.manifests_gateway import gateway_disruption_budget, gateway_objects

_PDB_API = "policy/v1"  # served since Kubernetes 1.21
AGENT_PORT = 9470  # the node agent's status API: /healthz, /v1/status, /metrics


def operator_objects(v: Values) -> list[Obj]:
    rules = [
        rule(["warmfleet.dev"], ["inferenceendpoints", "modelcaches", "imagecaches"], CRUD),
        rule(
            ["warmfleet.dev"],
            ["inferenceendpoints/status", "modelcaches/status", "imagecaches/status"],
            ["get", "update", "patch"],
        ),
        rule(["apps"], ["deployments", "daemonsets"], CRUD),
        rule([""], ["services"], CRUD),
        rule(["discovery.k8s.io"], ["endpointslices"], READ),  # the gateway pods to scrape
        rule([""], ["pods"], [*READ, "patch"]),
        rule([""], ["nodes"], [*READ, "patch"]),
        rule([""], ["namespaces"], READ),
        rule([""], ["events"], ["create", "patch"]),
        rule(["events.k8s.io"], ["events"], ["create", "patch"]),
        rule(["apiextensions.k8s.io"], ["customresourcedefinitions"], READ),
    ]
    args = [
        *("fleet", "operator", "--namespace", v.watch_namespace),
        *("--gateway-service", f"{v.namespace}/warmfleet-gateway:http"),
    ]
    operator = container("operator", v, args, resources("100m", "128Mi", "512Mi"))
    pod = unprivileged({"containers": [operator]})
    deployment = workload(
        "Deployment",
        "warmfleet-operator",
        v,
        "operator",
        pod,
        replicas=1,
        strategy={"type": "Recreate"},
    )
    return [*rbac("warmfleet-operator", v, "operator", rules), deployment]


def agent_objects(v: Values) -> list[Obj]:
    """The node agent: fills the caches assigned in its Node's annotation, reports progress."""
    rules = [rule([""], ["nodes"], [*READ, "patch"])]
    env = [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "WARMFLEET_CACHE_ROOT", "value": "/cache"},
    ]
    mounts = [
        {"name": "cache", "mountPath": "/cache"},
        {"name": "config", "mountPath": "/etc/warmfleet"},
    ]
    args = ["cache", "agent", "--config", "/etc/warmfleet/node.yaml"]
    agent = container(
        "agent",
        v,
        args,
        resources("200m", "256Mi", "1Gi"),
        ports=[{"name": "http", "containerPort": AGENT_PORT}],
        env=env,
        volumeMounts=mounts,
        # Ready once it serves: a rolling update moves to the next node only then.
        readinessProbe=http_probe("/healthz", period_s=10),
    )
    pod = {
        "priorityClassName": "system-node-critical",
        "tolerations": [{"operator": "Exists"}],
        "containers": [agent],
        "volumes": [
            {"name": "cache", "hostPath": {"path": v.host_path, "type": "DirectoryOrCreate"}},
            {"name": "config", "configMap": {"name": "warmfleet-node-agent"}},
        ],
    }
    update = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    daemonset = workload(
        "DaemonSet",
        "warmfleet-node-agent",
        v,
        "node-agent",
        pod,
        metrics_port=AGENT_PORT,
        updateStrategy=update,
    )
    return [*rbac("warmfleet-node-agent", v, "node-agent", rules), _agent_config(v), daemonset]


def _agent_config(v: Values) -> Obj:
    """The agent's ConfigMap (``node.yaml``). The status API on the pod's address, for
    Prometheus and the probe: read-only routes are open, changes need the agent's token (none
    is set here: refused off loopback)."""
    node_yaml = (
        "apiVersion: warmfleet.dev/v1alpha1\nkind: NodeCacheConfig\n"
        "spec:\n  root: /cache\n  capacity:\n    budget: 1TiB\n    reserve: 50GiB\n"
        f"  status:\n    host: 0.0.0.0\n    port: {AGENT_PORT}\n"
        f"  kubernetes:\n    hostPath: {v.host_path}\n"
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta("warmfleet-node-agent", v, "node-agent"),
        "data": {"node.yaml": node_yaml},
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
        "templates/gateway-pdb.yaml": (
            f'{{{{- if .Capabilities.APIVersions.Has "{_PDB_API}" }}}}\n'
            f"{dump([gateway_disruption_budget(HELM)])}{{{{- end }}}}\n"
        ),
    }
    for crd in all_crds():
        files[f"crds/{crd['metadata']['name']}.yaml"] = dump([crd])
    return files


def rendered_files() -> dict[str, str]:
    """Path (relative to deploy/) -> content, for every generated file."""
    files = {f"crds/{c['metadata']['name']}.yaml": dump([c]) for c in all_crds()}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": Values().namespace}}
    files["manifests/warmfleet.yaml"] = dump([namespace, *install_objects(Values())])
    files["manifests/warmfleet-gateway-pdb.yaml"] = dump([gateway_disruption_budget(Values())])
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
