"""``kube.endpointslices.endpoints_from_slices`` on dual-stack Services: a pod in both the IPv4
and the IPv6 slice is one instance whose URL does not depend on the slices' order (IPv4 when
both are usable), and each address is checked against its slice's ``addressType`` (FQDN
included)."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from warmfleet.kube.endpointslices import endpoints_from_slices


def endpoint(address: str, pod: str | None, ready: bool = True) -> dict[str, Any]:
    ep: dict[str, Any] = {"addresses": [address], "conditions": {"ready": ready}}
    if pod is not None:
        ep["targetRef"] = {"kind": "Pod", "name": pod, "namespace": "default"}
    return ep


def slice_of(name: str, address_type: str, *endpoints: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": "llama"}},
        "addressType": address_type,
        "ports": [{"name": "http", "port": 8000}],
        "endpoints": list(endpoints),
    }


def urls(slices: list[dict[str, Any]]) -> dict[str, str]:
    return dict(endpoints_from_slices(slices, "http", lambda iid, url: (iid, url)))


V4 = slice_of("llama-v4", "IPv4", endpoint("10.0.0.1", "pod-a"), endpoint("10.0.0.2", "pod-b"))
V6 = slice_of("llama-v6", "IPv6", endpoint("fd00::1", "pod-a"), endpoint("fd00::2", "pod-b"))
FQDN = slice_of("llama-dns", "FQDN", endpoint("a.engines.default.svc", "pod-a"))


def test_a_dual_stack_pod_keeps_its_ipv4_url_whatever_the_slice_order() -> None:
    want = {"pod-a": "http://10.0.0.1:8000", "pod-b": "http://10.0.0.2:8000"}
    for order in itertools.permutations([V4, V6, FQDN]):
        assert urls(list(order)) == want, [s["metadata"]["name"] for s in order]


def test_the_other_family_serves_when_ipv4_cannot() -> None:
    assert urls([V6]) == {"pod-a": "http://[fd00::1]:8000", "pod-b": "http://[fd00::2]:8000"}
    assert urls([FQDN, V6])["pod-a"] == "http://[fd00::1]:8000"
    assert urls([FQDN]) == {"pod-a": "http://a.engines.default.svc:8000"}
    # pod-a not ready in the IPv4 slice (slices are updated one at a time): its IPv6 address
    not_ready = slice_of("llama-v4", "IPv4", endpoint("10.0.0.1", "pod-a", ready=False))
    assert urls([V6, not_ready])["pod-a"] == "http://[fd00::1]:8000"

    def refuse_v4(iid: str, url: str) -> tuple[str, str]:
        if "10.0.0.1" in url:
            raise ValueError("refused")
        return iid, url

    found = dict(endpoints_from_slices([V4, V6], "http", refuse_v4))
    assert found["pod-a"] == "http://[fd00::1]:8000"  # the next candidate, not a gap
    assert found["pod-b"] == "http://10.0.0.2:8000"


def test_addresses_must_match_their_slices_address_type() -> None:
    wrong = [
        slice_of("a", "IPv4", endpoint("fd00::9", "pod-x"), endpoint("10.0.0.300", "pod-y")),
        slice_of("b", "IPv6", endpoint("10.0.0.9", "pod-z"), endpoint("fe80::1%eth0", "pod-w")),
        slice_of(
            "c",
            "FQDN",
            endpoint("evil.example/path?", "pod-v"),
            endpoint("user@host.example", "pod-u"),
            endpoint("-bad.example", "pod-t"),
            endpoint("10.0.0.9", "pod-s"),  # an IP is not a DNS name here
        ),
    ]
    assert urls(wrong) == {}
    # a mislabelled address does not hide a good one of the same pod in another slice
    assert urls([*wrong, slice_of("d", "IPv6", endpoint("fd00::9", "pod-x"))]) == {
        "pod-x": "http://[fd00::9]:8000"
    }


@given(st.permutations([V4, V6, FQDN]), st.lists(st.booleans(), min_size=3, max_size=3))
def test_the_result_never_depends_on_slice_order(
    order: list[dict[str, Any]], reversed_endpoints: list[bool]
) -> None:
    shuffled = [
        {**s, "endpoints": s["endpoints"][::-1]} if flip else s
        for s, flip in zip(order, reversed_endpoints, strict=True)
    ]
    assert urls(shuffled) == urls([V4, V6, FQDN])
