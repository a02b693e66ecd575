"""Every manifest validates: Kubernetes schemas (kubernetes-validate), CRD schemas, structure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from fleet_world import endpoint_world

from warmfleet.api import names
from warmfleet.api.crds import all_crds
from warmfleet.api.resources import InferenceEndpoint, wire
from warmfleet.cache.config import load_node_config
from warmfleet.control.reconciler import deployment_plan
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.discovery.inference_endpoints import derive_endpoints
from warmfleet.kube.owners import endpoint_service_problem
from warmfleet.operator import render
from warmfleet.operator.manifest_parts import Values
from warmfleet.operator.manifests import agent_objects, operator_objects, rendered_files
from warmfleet.operator.manifests_gateway import NAME, gateway_objects

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.37.0"
Obj = dict[str, Any]


def k8s_validate(obj: Obj) -> None:
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        first = str(err).splitlines()[0]
        raise AssertionError(f"{obj['kind']} {obj['metadata'].get('name')}: {first}") from None


def crd_schema(kind: str, part: str | None = None) -> Obj:
    crd = next(c for c in all_crds() if c["spec"]["names"]["kind"] == kind)
    schema: Obj = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema if part is None else schema["properties"][part]


def crd_validate(kind: str, obj: Obj) -> None:
    jsonschema.Draft4Validator(crd_schema(kind)).validate(obj)


def test_generated_files_are_in_sync() -> None:
    for rel, content in rendered_files().items():
        path = DEPLOY / rel
        assert path.exists(), f"{path} missing: run `warmfleet fleet render`"
        assert path.read_text() == content, f"{path} stale: run `warmfleet fleet render`"


def test_plain_manifests_validate() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "manifests/warmfleet.yaml").read_text()))
    assert {d["kind"] for d in docs} >= {"Deployment", "DaemonSet", "ClusterRole", "Service"}
    for doc in docs:
        k8s_validate(doc)


def test_helm_chart_renders_with_helm_and_validates() -> None:
    """Helm itself (its Go SDK, through helm-python-sdk) renders the chart: every object
    validates, the gateway mounts a ConfigMap the chart creates, and values reach the objects."""
    chart_dir = DEPLOY / "helm/warmfleet"
    assert yaml.safe_load((chart_dir / "Chart.yaml").read_text())["apiVersion"] == "v2"
    values = {"operator": {"watchNamespace": "serving"}, "image": {"tag": "9.9.9"}}
    with helm.Chart.load(str(chart_dir)) as chart:
        rendered = chart.render(values, name="warmfleet", namespace="warmfleet-system")
        crds = chart.crds
    assert len(rendered) == 4  # operator, node agent, gateway, the gateway's disruption budget
    objects = [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]
    for obj in objects:
        k8s_validate(obj)
        assert obj["metadata"].get("namespace", "warmfleet-system") == "warmfleet-system"
    assert len(crds) == 3
    for crd in crds:
        k8s_validate(yaml.safe_load(crd["data"]))
    by_kind = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    assert ("PodDisruptionBudget", "warmfleet-gateway") in by_kind  # Helm's versions have policy/v1
    gateway = by_kind["Deployment", "warmfleet-gateway"]["spec"]["template"]["spec"]
    (volume,) = [v for v in gateway["volumes"] if "configMap" in v]
    config = by_kind["ConfigMap", volume["configMap"]["name"]]
    document = parse_gateway_config(yaml.safe_load(config["data"]["gateway.yaml"]))
    assert document.spec.inference_endpoints is not None
    assert document.spec.inference_endpoints.namespace == "serving"
    assert gateway["containers"][0]["image"].endswith(":9.9.9")


def _walk(node: Any, path: str) -> None:
    if not isinstance(node, dict):
        return
    for forbidden in ("$ref", "anyOf", "oneOf", "allOf"):
        assert forbidden not in node, path
    if node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string"):
        return
    assert "type" in node, f"{path}: every schema node needs a type (structural schema)"
    assert not ("properties" in node and "additionalProperties" in node), path
    for key, child in (node.get("properties") or {}).items():
        _walk(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        _walk(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("crd", all_crds(), ids=lambda c: c["metadata"]["name"])
def test_crds_are_structural_and_valid(crd: Obj) -> None:
    k8s_validate(crd)
    _walk(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"], crd["spec"]["names"]["kind"])
    preserved = [
        line
        for line in yaml.safe_dump(crd).splitlines()
        if "x-kubernetes-preserve-unknown-fields" in line
    ]
    # InferenceEndpoint: a variant's routing.strategy, routing.key (old spellings kept) and
    # routing.key.defaultChatTemplateKwargs
    assert len(preserved) == (3 if crd["spec"]["names"]["kind"] == "InferenceEndpoint" else 0)


def test_old_routing_key_spelling_is_kept_by_the_crd_and_read_by_the_operator() -> None:
    """An object stored before v0.2 spelt ``routing.key`` in snake_case: the API server must not
    prune those fields (the CRD preserves them) and the model reads them as the new spelling."""
    doc = yaml.safe_load((DEPLOY / "examples/vllm-llama-3.1-70b.yaml").read_text())
    key_schema = crd_schema("InferenceEndpoint", "spec")["properties"]["variants"]["items"]
    key_schema = key_schema["properties"]["routing"]["properties"]["key"]
    assert key_schema["x-kubernetes-preserve-unknown-fields"] is True
    assert "blockSize" in key_schema["properties"]
    routing = doc["spec"]["variants"][0]["routing"]
    old = {**doc["spec"]["variants"][0], "routing": {**routing, "key": {"block_size": 64}}}
    new = {**doc["spec"]["variants"][0], "routing": {**routing, "key": {"blockSize": 64}}}
    for variant in (old, new):
        obj = {**doc, "spec": {**doc["spec"], "variants": [variant]}}
        crd_validate("InferenceEndpoint", obj)
        parsed = InferenceEndpoint.model_validate(obj)
        assert parsed.spec.variants[0].routing.key.block_size == 64


def test_example_validates_against_crd_and_model() -> None:
    doc = yaml.safe_load((DEPLOY / "examples/vllm-llama-3.1-70b.yaml").read_text())
    crd_validate("InferenceEndpoint", doc)
    endpoint = InferenceEndpoint.model_validate(doc)
    assert endpoint.spec.variants[0].routing.strategy.type == "prefix_affinity"
    assert (endpoint.spec.rollout.surge, endpoint.spec.rollout.unavailable) == (0, 1)
    with pytest.raises(jsonschema.ValidationError):
        crd_validate("InferenceEndpoint", {**doc, "spec": {**doc["spec"], "port": 0}})


def test_installed_gateway_config_follows_the_example_endpoints_variant_services() -> None:
    """The install creates the ConfigMap the gateway Deployment mounts: a valid Gateway document
    that derives the example endpoint's variants on the Services the operator creates for them,
    and serves the model name the example's engines serve."""
    objects = gateway_objects(Values())
    (doc,) = [o for o in objects if o["kind"] == "ConfigMap"]
    k8s_validate(doc)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == doc["metadata"]["name"]
    gateway = parse_gateway_config(yaml.safe_load(doc["data"]["gateway.yaml"]))
    source = gateway.spec.inference_endpoints
    assert source is not None
    assert gateway.spec.model_selects_endpoint
    example = yaml.safe_load((DEPLOY / "examples/vllm-llama-3.1-70b.yaml").read_text())
    endpoint = InferenceEndpoint.model_validate(example)
    name = endpoint.metadata.name
    assert source.namespace == endpoint.metadata.namespace
    example["metadata"]["uid"] = "uid-1"  # the API server's; the Services' owner references
    (derived,) = derive_endpoints([example], source, endpoint.metadata.namespace)
    assert derived.name == name
    for gw_variant, variant in zip(derived.variants, endpoint.spec.variants, strict=True):
        disc = gw_variant.kubernetes_discovery()
        assert disc is not None
        service = render.service(name, 8000, "default", "uid-1", variant.name)
        assert disc.service == service["metadata"]["name"] == names.service_name(name, variant.name)
        assert disc.port == service["spec"]["ports"][0]["name"]
        assert endpoint_service_problem(service, disc.service, "uid-1") is None
        assert disc.service_owner_uid == "uid-1"
        assert gw_variant.routing == variant.routing
        assert gw_variant.models == [name]
    assert f"--served-model-name {name}" in " ".join(endpoint.spec.args)
    assert doc["metadata"]["name"] == "warmfleet-gateway"
    assert gateway.spec.listen.host == "0.0.0.0"  # reachable from outside the pod
    (role,) = [o for o in objects if o["kind"] == "ClusterRole"]  # the owner check reads Services
    assert {"get", "list", "watch"} <= {
        v for r in role["rules"] if "services" in r["resources"] for v in r["verbs"]
    }


def test_installed_gateway_replicas_share_routing_state_through_their_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two gateway replicas are installed, so replica sync is on (issue 22): peers are the
    ready pods of the gateway's own Service at its ``sync`` port, which the Deployment and
    the Service expose (catch-up on the next port), and each replica is named by its pod."""
    objects = {o["kind"]: o for o in gateway_objects(Values())}
    gateway = parse_gateway_config(yaml.safe_load(objects["ConfigMap"]["data"]["gateway.yaml"]))
    sync = gateway.spec.replica_sync
    assert sync is not None
    assert sync.peers.type == "kubernetes"
    assert sync.peers.service == objects["Service"]["metadata"]["name"]
    assert sync.listen.host == "0.0.0.0"
    service_ports = {p["name"]: p for p in objects["Service"]["spec"]["ports"]}
    assert service_ports[sync.peers.port]["port"] == sync.listen.port
    deployment = objects["Deployment"]
    assert deployment["spec"]["replicas"] > 1
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert service_ports["sync"]["targetPort"] == "sync"
    assert ports["sync"] == sync.listen.port
    assert ports["sync-catch-up"] == sync.listen.port + 1
    (env,) = [e for e in container["env"] if e["name"] == "POD_NAME"]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    monkeypatch.setenv("POD_NAME", "warmfleet-gateway-7d9-abc")
    assert sync.resolved_replica_id() == "warmfleet-gateway-7d9-abc"


def _selects(selector: Obj, labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _admits(policy: Obj, source_labels: dict[str, str], port: str) -> bool:
    """NetworkPolicy ingress for a source pod of the policy's namespace: a rule admits when its
    ``from`` is absent or one of its pod selectors matches, and its ``ports`` are absent or name
    ``port``."""
    for rule in policy["spec"]["ingress"]:
        sources = rule.get("from")
        if sources is not None and not any(
            _selects(s["podSelector"], source_labels) for s in sources if "podSelector" in s
        ):
            continue
        if rule.get("ports") is None or any(p["port"] == port for p in rule["ports"]):
            return True
    return False


def test_only_gateway_pods_reach_the_sync_ports() -> None:
    """Without CURVE the sync sockets take any connection: the installed NetworkPolicy admits
    the sync and catch-up ports from the gateway's own pods only, ``http`` from any pod (clients,
    the autoscaler, probes), and names no port the gateway does not have."""
    objects = {o["kind"]: o for o in gateway_objects(Values())}
    policy, pod = objects["NetworkPolicy"], objects["Deployment"]["spec"]["template"]
    gateway_labels = pod["metadata"]["labels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert _selects(policy["spec"]["podSelector"], gateway_labels)
    (container,) = pod["spec"]["containers"]
    ports = {p["name"] for p in container["ports"]}
    named = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert named == ports == {"http", "sync", "sync-catch-up"}
    client = {"app": "client"}
    assert _admits(policy, client, "http")
    assert _admits(policy, {}, "http")
    for port in ("sync", "sync-catch-up"):
        assert _admits(policy, gateway_labels, port)
        assert not _admits(policy, client, port)
        assert not _admits(policy, {}, port)


def test_a_drain_takes_one_gateway_replica_at_a_time() -> None:
    """The disruption budget selects exactly the gateway's pods and leaves one of its replicas
    serving; it ships as its own file (``policy/v1``) and validates."""
    (budget,) = yaml.safe_load_all((DEPLOY / "manifests/warmfleet-gateway-pdb.yaml").read_text())
    k8s_validate(budget)
    objects = [*gateway_objects(Values()), *agent_objects(Values())]
    workloads = [o for o in objects if o["kind"] in {"Deployment", "DaemonSet"}]
    selected = [
        w["metadata"]["name"]
        for w in workloads
        if _selects(budget["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])
    ]
    assert selected == ["warmfleet-gateway"]
    (gateway,) = [w for w in workloads if w["metadata"]["name"] == "warmfleet-gateway"]
    assert 0 < budget["spec"]["maxUnavailable"] < gateway["spec"]["replicas"]
    plain = yaml.safe_load_all((DEPLOY / "manifests/warmfleet.yaml").read_text())
    assert "PodDisruptionBudget" not in {d["kind"] for d in plain}  # applies on 1.20 as well


def test_gateway_replicas_prefer_different_nodes() -> None:
    """Two replicas on one node are lost together: the pod template prefers (never requires:
    a one-node cluster still runs both) nodes without another gateway pod."""
    pod = next(o for o in gateway_objects(Values()) if o["kind"] == "Deployment")["spec"]
    template = pod["template"]
    anti = template["spec"]["affinity"]["podAntiAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti
    (preferred,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    term = preferred["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert _selects(term["labelSelector"], template["metadata"]["labels"])
    assert pod["replicas"] > 1


def test_node_agent_config_serves_the_mounted_host_path() -> None:
    """The agent's ConfigMap turns on the Node-annotation protocol for the hostPath that its
    DaemonSet mounts at the cache root (engine pods mount that same path)."""
    objects = {o["kind"]: o for o in agent_objects(Values())}
    config = load_node_config(objects["ConfigMap"]["data"]["node.yaml"])
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "cache"]
    assert config.spec.kubernetes is not None
    assert config.spec.kubernetes.host_path == volume["hostPath"]["path"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert config.spec.root == mounts["cache"]


def test_gateway_and_node_agent_pods_are_scraped_where_they_serve_metrics() -> None:
    """The ``prometheus.io/*`` annotations name a declared container port, and the process
    listens there off loopback (the alert rules, docs/alerts.md, read both)."""
    objects = [*agent_objects(Values()), *gateway_objects(Values())]
    workloads = {o["kind"]: o for o in objects if o["kind"] in {"Deployment", "DaemonSet"}}
    configs = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    for workload in workloads.values():
        template = workload["spec"]["template"]
        notes = template["metadata"]["annotations"]
        assert (notes["prometheus.io/scrape"], notes["prometheus.io/path"]) == ("true", "/metrics")
        (container,) = template["spec"]["containers"]
        ports = {p["containerPort"] for p in container["ports"]}
        assert int(notes["prometheus.io/port"]) in ports
    agent = load_node_config(configs["warmfleet-node-agent"]["node.yaml"]).spec.status
    assert (agent.host, str(agent.port)) == ("0.0.0.0", _annotated_port(workloads["DaemonSet"]))
    gateway = parse_gateway_config(yaml.safe_load(configs["warmfleet-gateway"]["gateway.yaml"]))
    listen = gateway.spec.listen
    assert (listen.host, str(listen.port)) == ("0.0.0.0", _annotated_port(workloads["Deployment"]))


def _annotated_port(workload: Obj) -> str:
    port: str = workload["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"]
    return port


def test_gateway_and_operator_pods_pass_the_restricted_pod_security_profile() -> None:
    """The Pod Security Standards' ``restricted`` rules for the two pods that need no
    privilege (the node agent writes a root-owned hostPath, so it stays as it was): a non-root
    user, the runtime's seccomp profile, no privilege escalation, every capability dropped, no
    host namespaces or hostPath; and a read-only root file system whose only writable place is
    the pod's own ``/tmp``."""
    objects = [*operator_objects(Values()), *gateway_objects(Values())]
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {"warmfleet-operator", NAME}
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True
        assert context["runAsUser"] > 0
        assert context["seccompProfile"]["type"] == "RuntimeDefault"
        assert not {"hostNetwork", "hostPID", "hostIPC"} & pod.keys()
        assert all("hostPath" not in volume for volume in pod["volumes"])
        empty = {v["name"] for v in pod["volumes"] if v.get("emptyDir") == {}}
        for container in pod["containers"]:
            locked = container["securityContext"]
            assert locked["allowPrivilegeEscalation"] is False
            assert locked["capabilities"] == {"drop": ["ALL"]}
            assert "privileged" not in locked
            assert locked["readOnlyRootFilesystem"] is True
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert mounts["/tmp"] in empty


def test_runtime_objects_and_statuses_validate() -> None:
    world, endpoint = endpoint_world()
    for variant in endpoint.spec.variants:
        plan = deployment_plan(endpoint, variant)
        k8s_validate(render.deployment(plan, "default", "uid-1"))
    k8s_validate(render.service(endpoint.name, 8000, "default", "uid-1"))
    k8s_validate(render.service(endpoint.name, 8000, "default", "uid-1", variant="main"))
    k8s_validate(
        render.image_puller("img-abc", "vllm/vllm-openai:v0.9", {"pool": "gpu"}, "default")
    )
    status = world.endpoints[endpoint.name].status
    assert status is not None
    crd_validate(
        "InferenceEndpoint",
        {
            "apiVersion": "warmfleet.dev/v1alpha1",
            "kind": "InferenceEndpoint",
            "metadata": {"name": "e"},
            "spec": wire(endpoint.spec),
            "status": wire(status),
        },
    )
    for cache in world.model_caches.values():
        assert cache.status is not None
        crd_validate("ModelCache", {"spec": wire(cache.spec), "status": wire(cache.status)})
    for image in world.image_caches.values():
        assert image.status is not None
        crd_validate("ImageCache", {"spec": wire(image.spec), "status": wire(image.status)})


def test_gateway_liveness_probes_health_and_readiness_probes_the_gateway() -> None:
    """A wedged event loop is restarted (/health answers from it); readiness is the gateway's
    own (/ready?scope=gateway), not plain /ready, which fails while any endpoint lacks a healthy
    engine (every gateway pod would leave the Service at once)."""
    deployment = next(o for o in gateway_objects(Values()) if o["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "http", "containerPort": 8080} in container["ports"]
    assert container["livenessProbe"] == {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": 10,
        "failureThreshold": 3,
        "timeoutSeconds": 2,
    }
    assert container["readinessProbe"] == {
        "httpGet": {"path": "/ready?scope=gateway", "port": "http"},
        "periodSeconds": 5,
        "failureThreshold": 2,
        "timeoutSeconds": 2,
    }
    k8s_validate(deployment)
