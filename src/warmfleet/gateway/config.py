"""The gateway's configuration document (``apiVersion: warmfleet.dev/v1alpha1``, ``kind: Gateway``).

Model of the world, like SageMaker's: endpoints -> production variants (traffic weight, one
routing config, a set of instances) -> instances. Every model forbids unknown fields; an invalid
document raises ``ConfigError`` naming each bad field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from yarl import URL

from warmfleet.core.config import StrictModel, parse_document
from warmfleet.core.errors import ConfigError
from warmfleet.edge import load_yaml_file
from warmfleet.gateway.capture_config import CaptureConfig
from warmfleet.gateway.hold_config import HoldConfig
from warmfleet.gateway.http.upstream import Origin
from warmfleet.gateway.kube_watch_config import DNS_LABEL, KubeWatchSpec
from warmfleet.gateway.kv_config import KvEventsConfig
from warmfleet.gateway.replica_sync.config import ReplicaSyncConfig
from warmfleet.gateway.server_config import (
    AdminConfig,
    HealthConfig,
    LimitsConfig,
    ListenConfig,
)
from warmfleet.routing.config import RoutingConfig

KIND = "Gateway"
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"

Name = Annotated[str, Field(pattern=_NAME_PATTERN)]


class InstanceSpec(StrictModel):
    """``data_parallel_rank``: one data-parallel rank of a vLLM/SGLang server started with
    ``--data-parallel-size`` (one entry per rank, same ``url``); its requests carry
    ``X-Data-Parallel-Rank`` so the server's own DP balancer does not move them off the rank
    whose KV cache the gateway routed for."""

    id: Name
    url: str
    data_parallel_rank: int | None = Field(default=None, ge=0)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        try:
            url = URL(value)
        except (ValueError, TypeError) as err:
            raise ValueError(f"not a URL: {err}") from err
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("must be an http(s) URL with a host")
        if not all(c.isprintable() and not c.isspace() for c in value):
            raise ValueError("must not contain spaces or control characters")
        if url.query_string or url.fragment:
            raise ValueError("must not have a query or fragment")
        normalized = str(url).rstrip("/")
        check_origin(normalized)
        return normalized


def check_origin(url: str) -> None:
    """``ValueError`` unless the gateway can send requests to ``url`` (``Origin`` parses it as
    every request does: a host with an empty label, ``a..b``, or one over 63 characters cannot
    be IDNA-encoded into the Host header)."""
    try:
        Origin(url)
    except ValueError as err:  # UnicodeError included
        raise ValueError(f"host {URL(url).host!r} is not a valid host name ({err})") from err


def redacted_url(url: str) -> str:
    """``url`` as shown to operators (admin API, logs): credentials replaced by ``***``."""
    parsed = URL(url)
    if parsed.user is None and parsed.password is None:
        return url
    return str(parsed.with_user("***").with_password(None))


class InstanceList(StrictModel):
    """The content of a discovery file: ``instances: [{id, url}, ...]``."""

    instances: list[InstanceSpec] = Field(default_factory=list)

    @field_validator("instances")
    @classmethod
    def _unique_ids(cls, value: list[InstanceSpec]) -> list[InstanceSpec]:
        _require_unique([i.id for i in value], "instance id")
        return value


class StaticDiscovery(StrictModel):
    type: Literal["static"] = "static"
    instances: list[InstanceSpec] = Field(default_factory=list)


class FileDiscovery(StrictModel):
    """A YAML/JSON file holding an ``InstanceList``, polled for changes (mtime and size)."""

    type: Literal["file"] = "file"
    path: str = Field(min_length=1)
    poll_interval_s: float = Field(default=1.0, gt=0)

    @property
    def source(self) -> str:
        return self.path


class KubernetesDiscovery(KubeWatchSpec):
    """The ready endpoints of a Kubernetes Service, from its EndpointSlices (list, then watch).
    The fleet controller creates a Service per ``InferenceEndpoint`` variant,
    ``<endpoint>-<variant>``. ``service_owner_uid`` (set by the gateway on the variants it
    derives from InferenceEndpoints, the object's ``metadata.uid``): the slices are followed only
    while the Service's controller ``ownerReference`` is the InferenceEndpoint of that uid (two
    endpoints can derive one Service name; the other one's engines are not this variant's)."""

    type: Literal["kubernetes"] = "kubernetes"
    service: str = Field(pattern=DNS_LABEL)
    scheme: Literal["http", "https"] = "http"
    service_owner_uid: str | None = Field(default=None, min_length=1, max_length=128)

    @property
    def source(self) -> str:
        return f"the EndpointSlices of Service {self.namespace or '(own namespace)'}/{self.service}"


Discovery = Annotated[
    StaticDiscovery | FileDiscovery | KubernetesDiscovery, Field(discriminator="type")
]


class VariantConfig(StrictModel):
    """A production variant. ``models`` lists the model names it serves (empty: any model).
    Exactly one of ``instances`` (a static list) and ``discovery`` may be given."""

    name: Name
    weight: float = Field(default=1.0, ge=0)
    models: list[str] = Field(default_factory=list)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    instances: list[InstanceSpec] | None = None
    discovery: Discovery | None = None
    invocations_path: str = Field(default="/invocations", pattern=r"^/")

    @model_validator(mode="after")
    def _one_instance_source(self) -> VariantConfig:
        if self.instances is not None and self.discovery is not None:
            raise ValueError("set at most one of instances and discovery")
        _require_unique([i.id for i in self.static_instances()], "instance id")
        return self

    def static_instances(self) -> list[InstanceSpec]:
        if self.instances is not None:
            return list(self.instances)
        if isinstance(self.discovery, StaticDiscovery):
            return list(self.discovery.instances)
        return []

    def file_discovery(self) -> FileDiscovery | None:
        return self.discovery if isinstance(self.discovery, FileDiscovery) else None

    def kubernetes_discovery(self) -> KubernetesDiscovery | None:
        return self.discovery if isinstance(self.discovery, KubernetesDiscovery) else None

    @property
    def discovered(self) -> bool:
        """Instances come from a file or Kubernetes, not from this document."""
        return isinstance(self.discovery, FileDiscovery | KubernetesDiscovery)


class EndpointConfig(StrictModel):
    name: Name
    variants: list[VariantConfig] = Field(min_length=1)

    @field_validator("variants")
    @classmethod
    def _unique_variants(cls, value: list[VariantConfig]) -> list[VariantConfig]:
        _require_unique([v.name for v in value], "variant name")
        return value


class InferenceEndpointsSource(KubeWatchSpec):
    """Endpoints from the fleet controller's ``InferenceEndpoint`` objects (listed, then watched):
    one gateway endpoint per InferenceEndpoint, named after it; one variant per production
    variant (its name, ``trafficWeight`` and ``routing``), serving the model named like the
    endpoint (engines run with ``--served-model-name <endpoint>``), whose instances are the
    ready pods of the Service ``<endpoint>-<variant>`` (``discovery: {type: kubernetes}``).
    An endpoint named like one in ``spec.endpoints`` is skipped (the document wins)."""


class GatewaySpec(StrictModel):
    listen: ListenConfig = Field(default_factory=ListenConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    admin: AdminConfig = Field(default_factory=AdminConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    seed: int = 0
    default_endpoint: str | None = None
    variant_header: str = Field(default="x-warmfleet-variant", min_length=1)
    models_cache_ttl_s: float = Field(default=10.0, ge=0)
    endpoints: list[EndpointConfig] = Field(default_factory=list)
    inference_endpoints: InferenceEndpointsSource | None = None
    model_selects_endpoint: bool = False
    tokenizer_path: str | None = Field(default=None, min_length=1)
    kv_events: KvEventsConfig | None = None
    access_log: bool = False  # a line per request on logger warmfleet.gateway.access (INFO)
    replica_sync: ReplicaSyncConfig | None = None  # off unless given (docs/replicas.md)
    capture: CaptureConfig | None = None  # traffic capture, off unless given (docs/gateway.md)
    hold: HoldConfig | None = None  # zero-ready hold, off unless given (gateway/hold.py)

    @model_validator(mode="after")
    def _endpoints_consistent(self) -> GatewaySpec:
        if not self.endpoints and self.inference_endpoints is None:
            raise ValueError("endpoints: at least one endpoint (or set inferenceEndpoints)")
        names = [e.name for e in self.endpoints]
        _require_unique(names, "endpoint name")
        if self.default_endpoint is not None and self.default_endpoint not in names:
            raise ValueError(f"defaultEndpoint {self.default_endpoint!r} is not an endpoint")
        return self

    @model_validator(mode="after")
    def _tokenizer_and_events(self) -> GatewaySpec:
        tokens = self.tokens_variants()
        if tokens and self.tokenizer_path is None:
            raise ValueError(
                f"tokenizerPath: required when routing.key.mode is 'tokens' ({tokens[0]})"
            )
        if self.kv_events is None:
            return self
        if len(tokens) != 1:
            raise ValueError(
                "kvEvents: needs exactly one variant with routing.key.mode 'tokens', "
                f"found {len(tokens)} ({', '.join(tokens) or 'none'})"
            )
        if self.kv_events.model is None and len(self.kv_events_variant().models) != 1:
            raise ValueError(
                f"kvEvents.model: required unless variant {tokens[0]} lists exactly one model"
            )
        return self

    def tokens_variants(self) -> list[str]:
        """Locations (``endpoints.i.variants.j``) of the variants keyed by token ids."""
        return [
            f"endpoints.{i}.variants.{j}"
            for i, endpoint in enumerate(self.endpoints)
            for j, variant in enumerate(endpoint.variants)
            if variant.routing.key.mode == "tokens"
        ]

    def kv_events_variant(self) -> VariantConfig:
        """The one tokens-mode variant whose router the KV events feed."""
        for endpoint in self.endpoints:
            for variant in endpoint.variants:
                if variant.routing.key.mode == "tokens":
                    return variant
        raise ConfigError("kvEvents: no variant with routing.key.mode 'tokens'")

    def kv_events_model(self) -> str | None:
        if self.kv_events is None:
            return None
        return self.kv_events.model or self.kv_events_variant().models[0]

    @property
    def default_endpoint_name(self) -> str | None:
        """``None``: no endpoint yet (only ``inference_endpoints``, none discovered)."""
        return self.default_endpoint or (self.endpoints[0].name if self.endpoints else None)


class GatewayConfig(StrictModel):
    apiVersion: Literal["warmfleet.dev/v1alpha1"]
    kind: Literal["Gateway"]
    spec: GatewaySpec


def _require_unique(values: list[str], what: str) -> None:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"duplicate {what} {value!r}")
        seen.add(value)


def parse_gateway_config(data: Any, source: str = "gateway config") -> GatewayConfig:
    """Validate a parsed document; ``ConfigError`` names every bad field."""
    config = parse_document(GatewayConfig, data, source)
    config.spec.admin.resolved_token()  # fail early on a bad token env var
    if config.spec.replica_sync is not None:
        config.spec.replica_sync.curve_key()  # and on a bad CURVE key's
    return config


def load_gateway_config(path: str | Path) -> GatewayConfig:
    """Read and validate a YAML (or JSON) gateway document; relative discovery-file paths are
    resolved against the document's directory."""
    path = Path(path)
    config = parse_gateway_config(load_yaml_file(path), str(path))
    return resolve_relative_paths(config, path.parent)


def resolve_relative_paths(config: GatewayConfig, base: Path) -> GatewayConfig:
    """Discovery files, ``tokenizer_path`` and ``capture.path`` relative to ``base`` (the
    document's directory)."""
    endpoints = []
    for endpoint in config.spec.endpoints:
        variants = []
        for variant in endpoint.variants:
            disc = variant.file_discovery()
            if disc is not None and not Path(disc.path).is_absolute():
                disc = disc.model_copy(update={"path": str(base / disc.path)})
                variant = variant.model_copy(update={"discovery": disc})
            variants.append(variant)
        endpoints.append(endpoint.model_copy(update={"variants": variants}))
    update: dict[str, Any] = {"endpoints": endpoints}
    tokenizer_path = config.spec.tokenizer_path
    if tokenizer_path is not None and not Path(tokenizer_path).is_absolute():
        update["tokenizer_path"] = str(base / tokenizer_path)
    capture = config.spec.capture
    if capture is not None and not Path(capture.path).is_absolute():
        update["capture"] = capture.model_copy(update={"path": str(base / capture.path)})
    spec = config.spec.model_copy(update=update)
    return config.model_copy(update={"spec": spec})


def parse_instance_list(data: Any, source: str) -> InstanceList:
    if isinstance(data, list):
        data = {"instances": data}
    return parse_document(InstanceList, data, source)
