"""``spec.replicaSync`` of a Gateway document: this replica's sync socket, its peers and the
timings of batching, catch-up and peer loss (docs/replicas.md, "Live replicas")."""

from __future__ import annotations

import os
import socket
from typing import Annotated, Literal

from pydantic import Field, model_validator

from warmfleet.api.replica_sync import (
    DEFAULT_BATCH_INTERVAL_MS,
    DEFAULT_LOG_BYTES,
    MAX_BATCH_NOTES,
)
from warmfleet.core.config import StrictModel
from warmfleet.core.errors import ConfigError
from warmfleet.gateway.kube_watch_config import DNS_LABEL, KubeNamespaceSpec, KubeWatchSpec
from warmfleet.gateway.replica_sync.curve import CurveKey

# a host name starts with a letter or digit (ZeroMQ refuses tcp://-a:1, tcp://_a:1, tcp://.a:1)
_ENDPOINT = r"^tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9._-]*):[0-9]{1,5}$"
_REPLICA_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,254}$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_SECRET_KEY = r"^[-._a-zA-Z0-9]{1,253}$"

PeerEndpoint = Annotated[str, Field(pattern=_ENDPOINT)]


def endpoint_port(endpoint: str) -> int:
    """The port of a ``tcp://host:port`` endpoint."""
    return int(endpoint.rsplit(":", 1)[1])


def catch_up_endpoint(endpoint: str) -> str:
    """Where the replica whose sync socket is ``endpoint`` answers catch-up requests: the next
    port."""
    host, port = endpoint.rsplit(":", 1)
    return f"{host}:{int(port) + 1}"


class SyncListen(StrictModel):
    """This replica's PUB socket (``host:port``); its catch-up socket is on ``port + 1``."""

    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=9470, ge=1, le=65534)

    @property
    def endpoint(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"


class StaticPeers(StrictModel):
    """A fixed list of the peers' sync endpoints (``tcp://host:port``)."""

    type: Literal["static"] = "static"
    endpoints: list[PeerEndpoint] = Field(default_factory=list)


class FilePeers(StrictModel):
    """A YAML/JSON file holding a list of ``tcp://host:port`` endpoints (or ``{endpoints:
    [...]}``), polled for changes."""

    type: Literal["file"] = "file"
    path: str = Field(min_length=1)
    poll_interval_s: float = Field(default=1.0, gt=0)


class KubernetesPeers(KubeWatchSpec):
    """The ready endpoints of the gateway's own Service (its EndpointSlices, watched as the
    engines' are by ``discovery: {type: kubernetes}``); ``port``: the Service port of the sync
    socket, by name or number."""

    type: Literal["kubernetes"] = "kubernetes"
    service: str = Field(pattern=DNS_LABEL)
    port: (
        Annotated[str, Field(min_length=1, max_length=15)] | Annotated[int, Field(ge=1, le=65534)]
    ) = "sync"


Peers = Annotated[StaticPeers | FilePeers | KubernetesPeers, Field(discriminator="type")]


class CurveSecretRef(KubeNamespaceSpec):
    """The fleet's CURVE secret key in a Kubernetes Secret (``curve_secret.py``; its namespace
    and API access: ``KubeNamespaceSpec``): ``name``, its entry ``key`` (the Z85 text);
    ``create``: a replica that finds no Secret makes it with a new key (the first one wins;
    the others read it)."""

    name: str = Field(pattern=_DNS_SUBDOMAIN, max_length=253)
    key: str = Field(default="curve-secret", pattern=_SECRET_KEY)
    create: bool = True


class ReplicaSyncConfig(StrictModel):
    """Replica sync (off unless given). ``replica_id``: this replica's name among its peers
    (default ``$POD_NAME``, else the host name); ``batch_interval_ms``: the longest a note
    waits before it is sent (a batch also goes out at ``max_batch_notes``);
    ``heartbeat_interval_s``: an empty batch when nothing was sent for that long;
    ``apply_delay_ms``: the longest a peer's batch waits on the socket before it is read
    and applied when this replica routes nothing (a routing decision reads every batch waiting
    first; 0: each batch at once); ``peer_timeout_s``: a peer silent that long has its open
    requests forgotten;
    ``catch_up_timeout_s``: the longest a starting replica waits for its peers' logs before it
    reports ready anyway; ``log_bytes``: the encoded batches each replica keeps for newcomers
    (8 bytes a prompt block; 32 MiB hold some 4 million blocks); ``curve_secret_env``: the
    environment variable holding the fleet's shared CURVE secret key (``curve.py``: peers
    without it are refused and the sockets are encrypted; unset: no authentication);
    ``curve_secret``: that key in a Kubernetes Secret instead (``CurveSecretRef``)."""

    replica_id: Annotated[str, Field(pattern=_REPLICA_ID)] | None = None
    listen: SyncListen = Field(default_factory=SyncListen)
    peers: Peers = Field(default_factory=StaticPeers)
    batch_interval_ms: float = Field(default=DEFAULT_BATCH_INTERVAL_MS, ge=0, le=1000)
    max_batch_notes: int = Field(default=256, ge=1, le=MAX_BATCH_NOTES)
    apply_delay_ms: float = Field(default=50.0, ge=0, le=1000)
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    peer_timeout_s: float = Field(default=5.0, gt=0)
    catch_up_timeout_s: float = Field(default=10.0, ge=0)
    log_bytes: int = Field(default=DEFAULT_LOG_BYTES, ge=0, le=1 << 32)
    curve_secret_env: str | None = Field(default=None, pattern=_ENV_NAME)
    curve_secret: CurveSecretRef | None = None

    @model_validator(mode="after")
    def _timeout_outlasts_heartbeats(self) -> ReplicaSyncConfig:
        if self.peer_timeout_s <= 2 * self.heartbeat_interval_s + self.apply_delay_ms / 1000:
            raise ValueError(
                "peerTimeoutS: must be more than twice heartbeatIntervalS plus applyDelayMs "
                "(a live peer would be taken for gone)"
            )
        return self

    @model_validator(mode="after")
    def _one_key_source(self) -> ReplicaSyncConfig:
        if self.curve_secret is not None and self.curve_secret_env is not None:
            raise ValueError("curveSecret, curveSecretEnv: set at most one (one key per fleet)")
        return self

    def curve_key(self) -> CurveKey | None:
        """The fleet's CURVE keypair from ``$curve_secret_env`` (None without the setting; with
        ``curve_secret`` the key is read at start, ``curve_secret.fleet_curve_key``); a
        variable unset or not a key is a ``ConfigError`` naming it (never a silent fallback to
        no authentication)."""
        name = self.curve_secret_env
        if name is None:
            return None
        value = os.environ.get(name)
        if value is None:
            raise ConfigError(f"spec.replicaSync.curveSecretEnv: ${name} is not set")
        return CurveKey.from_secret(value, f"spec.replicaSync.curveSecretEnv: ${name}")

    def resolved_replica_id(self) -> str:
        """``replica_id``, else ``$POD_NAME``, else the host name."""
        return self.replica_id or pod_name()


def pod_name() -> str:
    """This process's pod (``$POD_NAME``, else the host name, which Kubernetes sets to it): how
    the gateway's Service's endpoints name it, whatever ``replicaId`` says."""
    return os.environ.get("POD_NAME") or socket.gethostname()
