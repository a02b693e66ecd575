"""How a component reaches the Kubernetes API (pure settings; ``warmfleet.kube`` does the I/O).

In a pod every field can stay unset: the API server comes from ``$KUBERNETES_SERVICE_HOST`` /
``_PORT`` and the service account's token and CA files are used. Outside a cluster, set
``kubeconfig`` (a kubeconfig file: the server, bearer token and CA of its current context, or of
``context``), or ``api_server`` (and the token and CA files if the server needs them).
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator
from yarl import URL

from warmfleet.core.config import StrictModel

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class KubeApiSpec(StrictModel):
    api_server: str | None = None
    token_path: str = f"{SERVICE_ACCOUNT_DIR}/token"
    ca_path: str = f"{SERVICE_ACCOUNT_DIR}/ca.crt"
    timeout_s: float = Field(default=10.0, gt=0)
    kubeconfig: str | None = Field(default=None, min_length=1)
    context: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_locator(self) -> KubeApiSpec:
        if self.kubeconfig is not None and self.api_server is not None:
            raise ValueError("set at most one of apiServer and kubeconfig")
        if self.context is not None and self.kubeconfig is None:
            raise ValueError("context needs kubeconfig")
        return self

    @field_validator("api_server")
    @classmethod
    def _api_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        url = URL(value)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("must be an http(s) URL with a host")
        return str(url).rstrip("/")
