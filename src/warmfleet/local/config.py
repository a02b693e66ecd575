"""``kind: LocalFleet`` (``warmfleet up fleet.yaml``): nodes, a synthetic model origin, the engine,
the gateway and the InferenceEndpoints, in one versioned document.

Model sources use ``origin://<model>`` with a ``revision`` listed under ``origin.models``; the
backend serves every listed revision as a generated file from its local HTTP origin.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from warmfleet.api.resources import InferenceEndpointSpec, WireModel
from warmfleet.cache.config import Size
from warmfleet.core.config import parse_document
from warmfleet.core.errors import ConfigError
from warmfleet.edge import load_yaml_file

ORIGIN_SCHEME = "origin://"


class NodeConfig(WireModel):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=40)
    budget: Size = Field(description="disk budget of the node cache (bytes or '1GiB')")
    labels: dict[str, str] = Field(default_factory=dict)


class SyntheticModel(WireModel):
    name: str = Field(pattern=r"^[a-z0-9][-a-z0-9_.]*$", max_length=64)
    size: Size = Field(gt=0, description="bytes of each revision's weights file")
    revisions: tuple[str, ...] = Field(min_length=1)


class OriginConfig(WireModel):
    throttle: Size | None = Field(
        default=100_000_000, description="origin bytes/s over all connections; null = unlimited"
    )
    models: tuple[SyntheticModel, ...] = Field(min_length=1)


class EngineConfig(WireModel):
    preset: str = "tiny-cpu"
    speedup: float = Field(default=20.0, gt=0)
    replicas_per_node: int = Field(default=2, ge=1)
    start_timeout_s: float = Field(default=120.0, gt=0)
    crash_backoff_s: float = Field(default=10.0, ge=0)
    crash_backoff_max_s: float = Field(default=300.0, ge=0)


class GatewayPorts(WireModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    poll_interval_s: float = Field(default=0.2, gt=0)
    # the gateway's zero-ready hold (scale from zero): requests wait this long for a replica
    hold_timeout_s: float = Field(default=120.0, gt=0)
    max_held_per_variant: int = Field(default=64, ge=1)


class PeersConfig(WireModel):
    """Peer-to-peer weight distribution between the node agents (docs/peer-distribution.md)."""

    enabled: bool = False
    origin_fetches: int = Field(default=1, ge=1, description="origin copies per piece (k)")
    piece_bytes: Size = Field(default=16 * 2**20, gt=0)
    serve_bps: Size = Field(default=500_000_000, gt=0, description="upload bytes/s per node")
    max_uploads_per_peer: int = Field(default=4, ge=1)
    origin_streams: int = Field(default=12, ge=1, description="origin fetches at once, fleet-wide")
    stall_s: float = Field(default=2.0, gt=0, description="a peer silent this long is dropped")


class EndpointEntry(WireModel):
    name: str
    spec: InferenceEndpointSpec


class LocalFleetSpec(WireModel):
    workdir: str = ".warmfleet/fleet"
    nodes: tuple[NodeConfig, ...] = Field(min_length=1)
    origin: OriginConfig
    engine: EngineConfig = Field(default_factory=EngineConfig)
    gateway: GatewayPorts = Field(default_factory=GatewayPorts)
    reconcile_interval_s: float = Field(default=0.5, gt=0)
    agent_restart_delay_s: float = Field(default=2.0, ge=0)
    drain_grace_s: float = Field(default=1.0, ge=0)
    peers: PeersConfig = Field(default_factory=PeersConfig)
    endpoints: tuple[EndpointEntry, ...] = ()

    @field_validator("nodes")
    @classmethod
    def _unique_nodes(cls, value: tuple[NodeConfig, ...]) -> tuple[NodeConfig, ...]:
        names = [n.name for n in value]
        if len(set(names)) != len(names):
            raise ValueError(f"node names must be unique, got {names}")
        return value

    @model_validator(mode="after")
    def _sources_exist(self) -> LocalFleetSpec:
        for i, entry in enumerate(self.endpoints):
            source = entry.spec.model_source
            if not source.uri.startswith(ORIGIN_SCHEME):
                raise ValueError(f"endpoints.{i}.spec.modelSource.uri: use origin://<model>")
            model = self.model(source.uri[len(ORIGIN_SCHEME) :])
            if model is None or source.revision not in model.revisions:
                raise ValueError(
                    f"endpoints.{i}.spec.modelSource: {source.uri}@{source.revision} is not "
                    "listed under origin.models"
                )
        return self

    def model(self, name: str) -> SyntheticModel | None:
        return next((m for m in self.origin.models if m.name == name), None)


class LocalFleet(WireModel):
    api_version: Literal["warmfleet.dev/v1alpha1"] = "warmfleet.dev/v1alpha1"
    kind: Literal["LocalFleet"] = "LocalFleet"
    spec: LocalFleetSpec


def origin_file(model: str, revision: str) -> str:
    """The origin's file name of one model revision."""
    return f"{model}-{revision}.bin"


def origin_path(uri: str, revision: str) -> str:
    """``origin://m`` at ``revision`` -> the path under the origin's ``/files/``."""
    if not uri.startswith(ORIGIN_SCHEME):
        raise ConfigError(f"model source {uri!r}: the embedded fleet serves origin://<model> only")
    return origin_file(uri[len(ORIGIN_SCHEME) :], revision)


def origin_url_of(origin_url: str, uri: str, revision: str) -> str:
    """The URL the origin at ``origin_url`` serves ``origin://m`` at ``revision`` from."""
    return f"{origin_url}/files/{origin_path(uri, revision)}"


def parse_fleet(data: object, source: str = "fleet.yaml") -> LocalFleet:
    return parse_document(LocalFleet, data, source)


def load_fleet(path: Path) -> LocalFleet:
    return parse_fleet(load_yaml_file(path), str(path))
