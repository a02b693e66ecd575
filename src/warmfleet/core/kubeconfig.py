"""A kubeconfig file's current context, as an out-of-cluster client needs it (pure: parsing
only; ``warmfleet.kube`` reads the file and opens the connection).

Supported: the server URL, a bearer ``token`` or ``tokenFile``, the CA as
``certificate-authority`` (a path, relative to the kubeconfig's directory) or
``certificate-authority-data``, and ``insecure-skip-tls-verify``. Other credentials (client
certificates, exec and auth-provider plugins) are refused with a message naming them.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from warmfleet.core.config import StrictModel, format_validation_error
from warmfleet.core.errors import ConfigError


class _Loose(BaseModel):
    """kubeconfig sections: fields we do not use are ignored (kubectl writes many)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class _Cluster(_Loose):
    server: str
    certificate_authority: str | None = Field(default=None, alias="certificate-authority")
    certificate_authority_data: str | None = Field(default=None, alias="certificate-authority-data")
    insecure_skip_tls_verify: bool = Field(default=False, alias="insecure-skip-tls-verify")


class _User(_Loose):
    token: str | None = None
    token_file: str | None = Field(default=None, alias="tokenFile")
    client_certificate: str | None = Field(default=None, alias="client-certificate")
    client_certificate_data: str | None = Field(default=None, alias="client-certificate-data")
    exec_: dict[str, Any] | None = Field(default=None, alias="exec")
    auth_provider: dict[str, Any] | None = Field(default=None, alias="auth-provider")
    username: str | None = None


class _Context(_Loose):
    cluster: str
    user: str = ""
    namespace: str | None = None


class _Named(_Loose):
    name: str


class _NamedCluster(_Named):
    cluster: _Cluster


class _NamedUser(_Named):
    user: _User = Field(default_factory=_User)


class _NamedContext(_Named):
    context: _Context


class _Kubeconfig(_Loose):
    clusters: list[_NamedCluster] = Field(default_factory=list)
    users: list[_NamedUser] = Field(default_factory=list)
    contexts: list[_NamedContext] = Field(default_factory=list)
    current_context: str = Field(default="", alias="current-context")


class KubeContext(StrictModel):
    """What a client needs to reach the API server of one kubeconfig context."""

    server: str
    token: str | None = None
    token_path: str | None = None
    ca_pem: str | None = None
    ca_path: str | None = None
    insecure: bool = False
    namespace: str | None = None


def kube_context(data: Any, source: str, base_dir: Path, context: str | None = None) -> KubeContext:
    """The ``context`` (default: the current context) of a parsed kubeconfig document;
    ``ConfigError`` naming the problem otherwise."""
    try:
        config = _Kubeconfig.model_validate(data if data is not None else {})
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from err
    name = context or config.current_context
    if not name:
        raise ConfigError(f"{source}: no current-context (and no context given)")
    ctx = _find(config.contexts, name, "context", source).context
    cluster = _find(config.clusters, ctx.cluster, "cluster", source).cluster
    user = _find(config.users, ctx.user, "user", source).user if ctx.user else _User()
    unsupported = [
        label
        for label, value in (
            ("client-certificate", user.client_certificate or user.client_certificate_data),
            ("exec", user.exec_),
            ("auth-provider", user.auth_provider),
        )
        if value
    ]
    if unsupported and not (user.token or user.token_file):
        raise ConfigError(
            f"{source}: user {ctx.user!r} authenticates with {', '.join(unsupported)}, "
            "which warmfleet does not support: use a bearer token (token or tokenFile)"
        )
    if not cluster.server.startswith(("https://", "http://")):
        raise ConfigError(f"{source}: cluster {ctx.cluster!r}: server must be an http(s) URL")
    return KubeContext(
        server=cluster.server.rstrip("/"),
        token=user.token,
        token_path=_resolve(user.token_file, base_dir),
        ca_pem=_decode(cluster.certificate_authority_data, source, ctx.cluster),
        ca_path=_resolve(cluster.certificate_authority, base_dir),
        insecure=cluster.insecure_skip_tls_verify,
        namespace=ctx.namespace,
    )


_N = TypeVar("_N", bound=_Named)


def _find(items: list[_N], name: str, what: str, source: str) -> _N:
    for item in items:
        if item.name == name:
            return item
    raise ConfigError(f"{source}: no {what} named {name!r}")


def _resolve(path: str | None, base_dir: Path) -> str | None:
    if not path:
        return None
    return str(path if Path(path).is_absolute() else base_dir / path)


def _decode(data: str | None, source: str, cluster: str) -> str | None:
    if not data:
        return None
    try:
        return base64.b64decode(data, validate=True).decode("ascii")
    except (binascii.Error, UnicodeDecodeError) as err:
        raise ConfigError(
            f"{source}: cluster {cluster!r}: certificate-authority-data is not base64 PEM"
        ) from err
