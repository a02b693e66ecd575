"""EndpointSlices -> instances (pure) and the ``kubernetes`` discovery config."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmfleet.core.config import parse_document
from warmfleet.core.errors import ConfigError, WarmfleetError
from warmfleet.gateway.config import (
    InferenceEndpointsSource,
    KubernetesDiscovery,
    VariantConfig,
    parse_gateway_config,
)
from warmfleet.gateway.discovery.inference_endpoints import derive_endpoints
from warmfleet.gateway.discovery.kubernetes import SliceWatch, instances_from_slices, slice_watch
from warmfleet.kube.endpointslices import belongs_to
from warmfleet.routing.config import RoutingConfig


def endpoint(
    address: str, pod: str | None = None, ready: bool | None = True, **extra: Any
) -> dict[str, Any]:
    ep: dict[str, Any] = {"addresses": [address], **extra}
    if ready is not None:
        ep["conditions"] = {"ready": ready}
    if pod is not None:
        ep["targetRef"] = {"kind": "Pod", "name": pod, "namespace": "default"}
    return ep


def slice_of(
    *endpoints: dict[str, Any],
    name: str = "llama-abc",
    service: str = "llama",
    ports: list[dict[str, Any]] | None = None,
    address_type: str = "IPv4",
) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": address_type,
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}] if ports is None else ports,
        "endpoints": list(endpoints),
    }


def test_ready_endpoints_become_instances_named_after_their_pods() -> None:
    slices = [
        slice_of(
            endpoint("10.0.0.2", "llama-b"),
            endpoint("10.0.0.1", "llama-a", ready=None),  # nil means ready
            endpoint("10.0.0.3", "llama-c", ready=False),  # terminating or not ready
        )
    ]
    specs = instances_from_slices(slices, "http")
    assert [(s.id, s.url) for s in specs] == [
        ("llama-a", "http://10.0.0.1:8000"),
        ("llama-b", "http://10.0.0.2:8000"),
    ]


def test_port_by_name_or_number_and_missing_port() -> None:
    ports = [{"name": "metrics", "port": 9090}, {"name": "http", "port": 8000}]
    slices = [slice_of(endpoint("10.0.0.1", "a"), ports=ports)]
    assert instances_from_slices(slices, "http")[0].url == "http://10.0.0.1:8000"
    assert instances_from_slices(slices, 9090, "https")[0].url == "https://10.0.0.1:9090"
    assert instances_from_slices(slices, "grpc") == []
    assert instances_from_slices([slice_of(endpoint("10.0.0.1"), ports=[])], "http") == []


def test_ipv6_fqdn_first_address_and_ids_without_pods() -> None:
    v6 = slice_of(endpoint("fd00::5"), address_type="IPv6", name="s6")
    fqdn = slice_of(endpoint("engine-0.engines.default.svc"), address_type="FQDN", name="sf")
    two = slice_of({"addresses": ["10.0.0.7", "10.0.0.8"]}, name="s2")
    specs = {s.id: s.url for s in instances_from_slices([v6, fqdn, two], "http")}
    assert specs == {
        "fd00--5-8000": "http://[fd00::5]:8000",
        "engine-0.engines.default.svc-8000": "http://engine-0.engines.default.svc:8000",
        "10.0.0.7-8000": "http://10.0.0.7:8000",
    }


def test_long_pod_names_stay_distinct_instances_within_63_characters() -> None:
    """Two pods whose names share their first 63 characters (a long LeaderWorkerSet or bare pod
    name) are two instances, each id a valid instance name; a name of 63 is kept whole."""
    stem = "llama-3-70b-instruct-tensor-parallel-8-us-east-1-production-group"
    pods = [f"{stem}-0", f"{stem}-1", "a" * 63]
    slices = [slice_of(*(endpoint(f"10.0.0.{n}", pod) for n, pod in enumerate(pods, 1)))]
    specs = instances_from_slices(slices, "http")
    ids = {s.url: s.id for s in specs}
    assert len(set(ids.values())) == 3
    assert ids["http://10.0.0.3:8000"] == "a" * 63
    for url in ("http://10.0.0.1:8000", "http://10.0.0.2:8000"):
        assert len(ids[url]) == 63
        assert ids[url].startswith(stem[:54] + "-")
    assert instances_from_slices(slices, "http") == specs  # the same ids every time
    fqdn = "x" * 60 + ".engines.default.svc"  # an address-named id past 63 characters too
    long_named = slice_of(endpoint(fqdn), address_type="FQDN", name="sf")
    (spec,) = instances_from_slices([long_named], "http")
    assert len(spec.id) == 63
    assert spec.url == f"http://{fqdn}:8000"


def test_an_endpoint_in_two_slices_is_one_instance_and_bad_entries_are_skipped() -> None:
    a = slice_of(endpoint("10.0.0.1", "pod-a"), name="s1")
    moved = slice_of(endpoint("10.0.0.1", "pod-a"), endpoint("10.0.0.2", "pod-b"), name="s2")
    junk = slice_of(
        {"addresses": []},
        {"conditions": {"ready": True}},
        endpoint("", "pod-x"),  # no host: no URL
        "not an endpoint",  # type: ignore[arg-type]
        name="s3",
    )
    other_type = slice_of(endpoint("10.0.0.9", "pod-z"), address_type="Unknown", name="s4")
    shapeless = [
        {"metadata": [], "ports": {"http": 1}, "endpoints": {"a": 1}},
        slice_of({"addresses": {"0": "10.0.0.5"}}, name="s5"),
    ]
    specs = instances_from_slices([a, moved, junk, other_type, *shapeless], "http")
    assert [s.id for s in specs] == ["pod-a", "pod-b"]


def test_belongs_to_checks_the_service_label() -> None:
    assert belongs_to(slice_of(service="llama"), "llama")
    assert not belongs_to(slice_of(service="mistral"), "llama")
    assert not belongs_to({"metadata": {}}, "llama")
    assert not belongs_to({"metadata": ["llama"]}, "llama")


@given(
    st.lists(st.tuples(st.integers(0, 20), st.sampled_from([True, False, None])), max_size=30),
    st.integers(1, 4),
)
def test_exactly_the_ready_pods_once_each(eps: list[tuple[int, bool | None]], n: int) -> None:
    """However endpoints are spread over slices (and repeated), the result is the set of pods
    with a ready (or unknown) entry, each once, sorted."""
    slices = [
        slice_of(
            *[endpoint(f"10.0.1.{p}", f"pod-{p}", ready) for p, ready in eps[i::n]], name=f"s{i}"
        )
        for i in range(n)
    ]
    ids = [s.id for s in instances_from_slices(slices, "http")]
    assert ids == sorted({f"pod-{p}" for p, ready in eps if ready is not False})


def test_kubernetes_discovery_config_is_validated() -> None:
    ok = parse_document(
        VariantConfig,
        {"name": "v1", "discovery": {"type": "kubernetes", "service": "llama", "port": 8000}},
    )
    disc = ok.kubernetes_discovery()
    assert isinstance(disc, KubernetesDiscovery)
    assert disc.port == 8000
    assert ok.discovered
    assert ok.static_instances() == []
    for bad, field in (
        ({"service": "Llama_1"}, "service"),
        ({"service": "llama", "port": 0}, "port"),
        ({"service": "llama", "api_server": "ftp://x"}, "apiServer"),
        ({"service": "llama", "namespace": "-x"}, "namespace"),
        ({"service": "llama", "watch": True}, "watch"),
    ):
        with pytest.raises(ConfigError, match=field):
            parse_document(
                VariantConfig, {"name": "v1", "discovery": {"type": "kubernetes", **bad}}
            )


class _Owner:
    """Stands in for ``KubeDiscovery``: records what the watcher applies."""

    def __init__(self) -> None:
        self.applied: list[list[str]] = []

    def apply(self, _key: object, _disc: object, slices: Any) -> None:
        self.applied.append(sorted(s["metadata"]["name"] for s in slices))


def test_watch_events_update_the_slices_and_410_restarts_from_a_list() -> None:
    disc = KubernetesDiscovery(service="llama", namespace="default")
    owner = _Owner()
    watcher = slice_watch(owner, ("main", "v1", "{}"), disc)  # type: ignore[arg-type]
    assert isinstance(watcher, SliceWatch)  # no owner uid: the plain slice watch
    a, b = slice_of(name="llama-a"), slice_of(name="llama-b")
    assert watcher.event({"type": "ADDED", "object": a})
    assert watcher.event({"type": "MODIFIED", "object": b})
    assert watcher.event({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}})
    relabelled = slice_of(name="llama-a", service="mistral")  # no longer the Service's
    assert watcher.event({"type": "MODIFIED", "object": relabelled})
    assert watcher.event({"type": "DELETED", "object": b})
    assert owner.applied == [["llama-a"], ["llama-a", "llama-b"], ["llama-b"], []]
    assert watcher.event({"type": "MODIFIED", "object": ["not", "an", "object"]})
    assert watcher.event({"type": "ADDED", "object": {"metadata": "shapeless"}})
    assert owner.applied[-1] == []  # a nameless, label-less object is not one of the slices
    assert not watcher.event({"type": "ERROR", "object": {"code": 410, "message": "too old"}})
    with pytest.raises(WarmfleetError, match="watch error 500"):
        watcher.event({"type": "ERROR", "object": {"code": 500, "message": "boom"}})


def test_endpoints_derived_from_inference_endpoints() -> None:
    source = InferenceEndpointsSource(api_server="https://10.0.0.1:6443", port=8000)

    def obj(name: str, **meta: Any) -> dict[str, Any]:
        variants = [
            {"name": "main", "trafficWeight": 3, "routing": {"strategy": {"type": "random"}}},
            {"name": "canary", "trafficWeight": 1},
        ]
        spec = {"modelSource": {"uri": "s3://m/x"}, "image": "vllm:1", "variants": variants}
        return {"metadata": {"name": name, **meta}, "spec": spec}

    broken = obj("broken")
    del broken["spec"]["image"]
    derived = derive_endpoints(
        [obj("llama"), obj("gone", deletionTimestamp="2026-11-29T00:00:00Z"), broken, obj("mine")],
        source,
        "models",
        taken=["mine"],  # the document defines it: the document wins
    )
    assert [e.name for e in derived] == ["llama"]
    main, canary = derived[0].variants
    assert (main.name, main.weight, main.models) == ("main", 3.0, ["llama"])
    assert main.routing.strategy.type == "random"
    assert canary.routing.strategy.type == RoutingConfig().strategy.type
    disc = canary.kubernetes_discovery()
    assert disc is not None
    assert (disc.service, disc.namespace, disc.port) == ("llama-canary", "models", 8000)
    assert disc.api_server == "https://10.0.0.1:6443"


def test_a_gateway_needs_endpoints_or_their_source() -> None:
    doc: dict[str, Any] = {"apiVersion": "warmfleet.dev/v1alpha1", "kind": "Gateway", "spec": {}}
    with pytest.raises(ConfigError, match="endpoints: at least one endpoint"):
        parse_gateway_config(doc)
    doc["spec"]["inference_endpoints"] = {"namespace": "Bad_NS"}
    with pytest.raises(ConfigError, match=r"inferenceEndpoints\.namespace"):
        parse_gateway_config(doc)
    doc["spec"]["inference_endpoints"] = {}
    assert parse_gateway_config(doc).spec.default_endpoint_name is None
