"""What the gateway watches in Kubernetes and how (``KubeWatchSpec``): shared by the engines'
discovery (``discovery: {type: kubernetes}``), ``spec.inference_endpoints`` and the replica-sync
peers (``spec.replicaSync.peers: {type: kubernetes}``); the namespace part also by the
replicas' key Secret (``spec.replicaSync.curveSecret``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from warmfleet.core.kubeapi import SERVICE_ACCOUNT_DIR, KubeApiSpec

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class KubeNamespaceSpec(KubeApiSpec):
    """A namespace the gateway reads from: ``namespace`` ``None``: the gateway pod's own (read
    from ``namespace_path``). API access (``api_server``, ``token_path``, ``ca_path``,
    ``timeout_s``): ``KubeApiSpec``."""

    namespace: str | None = Field(default=None, pattern=DNS_LABEL)
    namespace_path: str = f"{SERVICE_ACCOUNT_DIR}/namespace"


class KubeWatchSpec(KubeNamespaceSpec):
    """What the gateway watches in Kubernetes, and how (the namespace: ``KubeNamespaceSpec``).
    ``port``: the engines' Service port, by name or number."""

    port: (
        Annotated[str, Field(min_length=1, max_length=15)] | Annotated[int, Field(ge=1, le=65535)]
    ) = "http"
    watch_timeout_s: float = Field(default=300.0, gt=0)
    retry_interval_s: float = Field(default=2.0, gt=0)
