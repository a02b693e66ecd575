"""EndpointSlice documents for tests: the shape the EndpointSlice controller writes for a
Service's pods (one address each, a ``targetRef`` naming the pod)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from warmfleet.kube.endpointslices import SERVICE_NAME_LABEL


def endpoint_slice(
    name: str,
    service: str,
    namespace: str,
    port: int,
    pods: Mapping[str, bool],
    *,
    port_name: str = "http",
    version: str = "v1",
) -> dict[str, Any]:
    """Slice ``name`` of ``service``: each of ``pods`` on 127.0.0.1 at ``port`` (the Service
    port ``port_name``), ready or not."""
    return {
        "apiVersion": f"discovery.k8s.io/{version}",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": namespace, "labels": {SERVICE_NAME_LABEL: service}},
        "addressType": "IPv4",
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": ["127.0.0.1"],
                "conditions": {"ready": ready},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": namespace},
            }
            for pod, ready in pods.items()
        ],
    }
