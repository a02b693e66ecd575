"""What the gateway watches in Kubernetes and how (``KubeWatchSpec``): shared by the engines'
discovery (``discovery: {type: kubernetes}``), ``spec.inference_endpoints`` and the replica-sync
peers (``spec.replicaSync.peers: {type: kubernetes}``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from warmfleet.core.kubeapi import SERVICE_ACCOUNT_DIR, KubeApiSpec

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class KubeWatchSpec(KubeApiSpec):
    """What the gateway watches in Kubernetes, and how. ``namespace`` ``None``: the gateway
    pod's own (read from ``namespace_path``). ``port``: the engines' Service port, by name or
    number. API access (``api_server``, ``token_path``, ``ca_path``, ``timeout_s``):
    ``KubeApiSpec``."""

    namespace: str | None = Field(default=None, pattern=DNS_LABEL)
    namespace_path: str = f"{SERVICE_ACCOUNT_DIR}/namespace"
    port: (
        Annotated[str, Field(min_length=1, max_length=15)] | Annotated[int, Field(ge=1, le=65535)]
    ) = "http"
    watch_timeout_s: float = Field(default=300.0, gt=0)
    retry_interval_s: float = Field(default=2.0, gt=0)
