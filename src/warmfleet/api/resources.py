"""The fleet resource model (apiVersion ``warmfleet.dev/v1alpha1``).

Three kinds, mirroring AWS HyperPod's model caching (see docs/fleet-controller.md):

- ``InferenceEndpoint``: model source, image, production variants (replicas, autoscaling, routing)
  and ``modelCacheConfig{weightsCache, imageCache}``.
- ``ModelCache``: the weights of one model revision on a set of nodes (AWS
  ``ModelWeightsCacheConfig``), one per endpoint revision.
- ``ImageCache``: one container image pinned on a set of nodes (AWS ``ModelImageCache``), shared by
  every endpoint that uses the image through ``parentReferences``.

Field names are camelCase on the wire (Kubernetes convention) and snake_case in Python.
Every model is frozen and forbids unknown fields.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from warmfleet.core.config import StrictModel
from warmfleet.routing.config import RoutingConfig

API_GROUP = "warmfleet.dev"
API_VERSION_NAME = "v1alpha1"
API_VERSION = f"{API_GROUP}/{API_VERSION_NAME}"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_ENDPOINT_NAME = 30  # leaves room for "-<variant>-<revision>" in a 63-char Deployment name
MAX_VARIANT_NAME = 15
_VARIANT_NAME_SCHEMA: JsonDict = {"pattern": _DNS_LABEL.pattern, "maxLength": MAX_VARIANT_NAME}


class WireModel(StrictModel):
    """camelCase on the wire, snake_case in Python; still frozen and strict."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


def _check_dns_label(value: str, limit: int) -> str:
    if len(value) > limit or not _DNS_LABEL.match(value):
        raise ValueError(f"must be a DNS label (a-z, 0-9, '-') of at most {limit} characters")
    return value


# ----------------------------------------------------------------------------------- spec parts


class ModelSource(WireModel):
    """Where the weights come from. ``revision`` pins the content (HF commit, S3 versionId)."""

    uri: str = Field(min_length=1, max_length=2048, description="s3://, hf://, https://, file://")
    revision: str = Field(default="", max_length=256, description="content pin; '' = as is")
    size_bytes: int | None = Field(default=None, ge=0, description="expected total size")


class GatePolicy(WireModel):
    """When the Deployment may be created while the weights cache fills.

    ``all`` waits for every target node (AWS behaviour); ``minReady`` waits for
    ``minReadyNodes`` nodes or ``minReadyPercent`` % of the target nodes; ``none`` never waits.
    With ``timeoutS`` set, the gate opens anyway that long after the cache was created (replicas
    on cold nodes then load from the origin).
    """

    mode: Literal["all", "minReady", "none"] = "all"
    min_ready_nodes: int | None = Field(default=None, ge=1)
    min_ready_percent: float | None = Field(default=None, gt=0.0, le=100.0)
    timeout_s: float | None = Field(default=None, gt=0.0)

    @model_validator(mode="after")
    def _min_ready_needs_a_threshold(self) -> GatePolicy:
        has_count = self.min_ready_nodes is not None
        has_percent = self.min_ready_percent is not None
        if self.mode == "minReady" and has_count == has_percent:
            raise ValueError("mode minReady needs exactly one of minReadyNodes, minReadyPercent")
        if self.mode != "minReady" and (has_count or has_percent):
            raise ValueError("minReadyNodes/minReadyPercent only apply to mode minReady")
        return self


IntOrPercent = int | Annotated[str, StringConstraints(pattern=r"^[0-9]{1,3}%$")]


class RolloutPolicy(WireModel):
    """How a new revision (new weights, image, host path or nodes) replaces the old one.

    ``BlueGreen`` (default): the new revision's Deployments come up in full beside the old ones,
    which are deleted once every new replica is ready: never below full capacity, but up to twice
    the replicas (and GPUs) meanwhile. ``Rolling``: Kubernetes' RollingUpdate across the two
    revisions: at most ``maxSurge`` replicas above the variant's count, at most
    ``maxUnavailable`` below it ready (an integer or a percentage of the count; surge rounds up,
    unavailable down, and if both come to 0, one may be unavailable, as in Kubernetes). With
    ``maxSurge: 0`` a fleet with no spare GPU can move to a new model. The same bounds are the
    Deployments' own update strategy for in-place changes (BlueGreen: maxSurge 1,
    maxUnavailable 0).
    """

    type: Literal["BlueGreen", "Rolling"] = "BlueGreen"
    max_surge: IntOrPercent | None = None
    max_unavailable: IntOrPercent | None = None

    @field_validator("max_surge", "max_unavailable")
    @classmethod
    def _non_negative(cls, value: IntOrPercent | None) -> IntOrPercent | None:
        if isinstance(value, int) and value < 0:
            raise ValueError("must be >= 0")
        return value

    @model_validator(mode="after")
    def _bounds(self) -> RolloutPolicy:
        if self.type == "BlueGreen":
            if self.max_surge is not None or self.max_unavailable is not None:
                raise ValueError("maxSurge/maxUnavailable only apply to type Rolling")
            return self
        if isinstance(self.max_unavailable, str) and int(self.max_unavailable[:-1]) > 100:
            raise ValueError("maxUnavailable may not be over 100%")
        if _is_zero(self.surge) and _is_zero(self.unavailable):
            raise ValueError("maxSurge and maxUnavailable may not both be 0")
        return self

    @property
    def surge(self) -> IntOrPercent:
        """``maxSurge`` (Rolling default 25 %, as Kubernetes; BlueGreen 1 for in-place
        updates)."""
        if self.type == "BlueGreen":
            return 1
        return "25%" if self.max_surge is None else self.max_surge

    @property
    def unavailable(self) -> IntOrPercent:
        if self.type == "BlueGreen":
            return 0
        return "25%" if self.max_unavailable is None else self.max_unavailable


def _is_zero(value: IntOrPercent) -> bool:
    return value == 0 or (isinstance(value, str) and int(value[:-1]) == 0)


class WeightsCacheConfig(WireModel):
    enabled: bool = False
    # absolute: a constraint, not a validator, so the CRD's schema has it too
    host_path: str = Field("/opt/warmfleet/cache", min_length=1, max_length=255, pattern="^/")
    gate: GatePolicy = Field(default_factory=GatePolicy)


class ImageCacheConfig(WireModel):
    enabled: bool = False


class ModelCacheConfig(WireModel):
    weights_cache: WeightsCacheConfig = Field(default_factory=WeightsCacheConfig)
    image_cache: ImageCacheConfig = Field(default_factory=ImageCacheConfig)


class AutoscalingSpec(WireModel):
    """HPA-like scaling on in-flight requests per replica (from the gateway's metrics).
    ``minReplicas: 0``: to zero after ``scaleToZeroAfterS`` with nothing in flight or held at the
    gateway; a request held there brings it back at once (``control.autoscaler``)."""

    enabled: bool = False
    min_replicas: int = Field(default=1, ge=0)
    scale_to_zero_after_s: float = Field(default=300.0, gt=0.0)
    max_replicas: int = Field(default=1, ge=1)
    target_in_flight_per_replica: float = Field(default=16.0, gt=0.0)
    tolerance: float = Field(default=0.1, ge=0.0, lt=1.0)
    scale_up_stabilization_s: float = Field(default=0.0, ge=0.0)
    scale_down_stabilization_s: float = Field(default=300.0, ge=0.0)
    scale_up_cooldown_s: float = Field(default=0.0, ge=0.0)
    scale_down_cooldown_s: float = Field(default=60.0, ge=0.0)
    scale_up_max_step: int = Field(default=4, ge=1, description="pods added per decision at most")
    scale_up_max_percent: float = Field(default=100.0, gt=0.0)

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("minReplicas must be <= maxReplicas")
        return self


class StandbySpec(WireModel):
    """Warm standby of a variant at zero replicas: with ``engine: asleep`` (needs the weights
    cache, which keeps the model on its nodes) the last replica is put to sleep (vLLM's
    ``/sleep?level=sleepLevel``) rather than stopped, and the first request after idle pays only
    its ``/wake_up`` (level 1: weights from host memory; level 2: from the node's disk)."""

    engine: Literal["none", "asleep"] = "none"
    sleep_level: Literal[1, 2] = 1


class ProductionVariant(WireModel):
    name: str = Field(json_schema_extra=_VARIANT_NAME_SCHEMA)  # _name's check, in the CRD too
    replicas: int = Field(default=1, ge=0)
    traffic_weight: float = Field(default=1.0, ge=0.0)
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    standby: StandbySpec = Field(default_factory=StandbySpec)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _check_dns_label(value, MAX_VARIANT_NAME)


class InferenceEndpointSpec(WireModel):
    model_source: ModelSource
    image: str = Field(min_length=1, max_length=512)
    port: int = Field(default=8000, ge=1, le=65535)
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    gpus_per_replica: int = Field(default=0, ge=0)
    node_selector: dict[str, str] = Field(default_factory=dict)
    model_cache_config: ModelCacheConfig = Field(default_factory=ModelCacheConfig)
    rollout: RolloutPolicy = Field(default_factory=RolloutPolicy)
    variants: tuple[ProductionVariant, ...] = Field(min_length=1)

    @field_validator("variants")
    @classmethod
    def _unique_variants(
        cls, value: tuple[ProductionVariant, ...]
    ) -> tuple[ProductionVariant, ...]:
        names = [v.name for v in value]
        if len(set(names)) != len(names):
            raise ValueError(f"variant names must be unique, got {names}")
        return value

    @model_validator(mode="after")
    def _standby_needs_cache(self) -> InferenceEndpointSpec:
        cached = self.model_cache_config.weights_cache.enabled
        for i, variant in enumerate(self.variants):
            if variant.standby.engine == "asleep" and not cached:
                raise ValueError(
                    f"variants.{i}.standby.engine asleep needs "
                    "modelCacheConfig.weightsCache.enabled (the standby's weights stay cached)"
                )
        return self


class ParentReference(WireModel):
    kind: str = "InferenceEndpoint"
    name: str
    namespace: str = "default"
    uid: str = ""


class ModelCacheSpec(WireModel):
    """Weights of one model revision on the nodes matching ``nodeSelector`` (AWS weights cache)."""

    enabled: bool = True
    host_path: str = Field(default="/opt/warmfleet/cache", min_length=1, max_length=255)
    model_source: ModelSource
    node_selector: dict[str, str] = Field(default_factory=dict)
    owner: str = Field(description="the InferenceEndpoint this cache belongs to")


class ImageCacheSpec(WireModel):
    """One container image pinned on the nodes matching ``nodeSelector`` (shared, refcounted)."""

    image: str = Field(min_length=1, max_length=512)
    node_selector: dict[str, str] = Field(default_factory=dict)
    parent_references: tuple[ParentReference, ...] = ()


# ----------------------------------------------------------------------------------- status


class CacheState(StrEnum):
    PENDING = "Pending"
    DOWNLOADING = "Downloading"
    READY = "Ready"
    PARTIALLY_READY = "PartiallyReady"
    FAILED = "Failed"
    DELETING = "Deleting"


class EndpointPhase(StrEnum):
    PENDING = "Pending"
    GATED = "WaitingForCache"  # the weights gate is closed
    DEPLOYING = "Deploying"
    READY = "Ready"
    ROLLING = "RollingOver"
    DELETING = "Deleting"


class Condition(WireModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""


class NodeProgress(WireModel):
    node: str
    state: str
    bytes_done: int = Field(default=0, ge=0)
    bytes_total: int = Field(default=0, ge=0)
    message: str = ""


class CacheStatus(WireModel):
    state: CacheState = CacheState.PENDING
    ready_nodes: int = Field(default=0, ge=0)
    target_nodes: int = Field(default=0, ge=0)
    nodes: tuple[NodeProgress, ...] = ()
    conditions: tuple[Condition, ...] = ()
    message: str = ""


class ImageCacheStatus(CacheStatus):
    resolved_digest: str = ""
    references: int = Field(default=0, ge=0)


class CacheSummary(WireModel):
    name: str
    state: CacheState
    ready_nodes: int = Field(ge=0)
    target_nodes: int = Field(ge=0)


class ReplicaStatus(WireModel):
    name: str
    node: str
    revision: str
    prepared: bool = Field(description="the node held the weights when the replica started")
    ready: bool
    time_to_ready_s: float | None = None


class EndpointStatus(WireModel):
    phase: EndpointPhase = EndpointPhase.PENDING
    revision: str = ""
    weights_cache: CacheSummary | None = None
    image_cache: CacheSummary | None = None
    replicas: int = Field(default=0, ge=0)
    ready_replicas: int = Field(default=0, ge=0)
    unprepared_replica_share: float = Field(default=0.0, ge=0.0, le=1.0)
    replica_status: tuple[ReplicaStatus, ...] = ()
    conditions: tuple[Condition, ...] = ()


# ----------------------------------------------------------------------------------- documents


class ObjectMeta(WireModel):
    name: str
    namespace: str = "default"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _check_dns_label(value, 63)


class InferenceEndpoint(WireModel):
    api_version: Literal["warmfleet.dev/v1alpha1"] = "warmfleet.dev/v1alpha1"
    kind: Literal["InferenceEndpoint"] = "InferenceEndpoint"
    metadata: ObjectMeta
    spec: InferenceEndpointSpec
    status: EndpointStatus | None = None

    @model_validator(mode="after")
    def _short_name(self) -> InferenceEndpoint:
        _check_dns_label(self.metadata.name, MAX_ENDPOINT_NAME)
        return self


class ModelCache(WireModel):
    api_version: Literal["warmfleet.dev/v1alpha1"] = "warmfleet.dev/v1alpha1"
    kind: Literal["ModelCache"] = "ModelCache"
    metadata: ObjectMeta
    spec: ModelCacheSpec
    status: CacheStatus | None = None


class ImageCache(WireModel):
    api_version: Literal["warmfleet.dev/v1alpha1"] = "warmfleet.dev/v1alpha1"
    kind: Literal["ImageCache"] = "ImageCache"
    metadata: ObjectMeta
    spec: ImageCacheSpec
    status: ImageCacheStatus | None = None


def wire(model: WireModel) -> dict[str, object]:
    """The camelCase JSON form of ``model`` (what goes to the API server / YAML)."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)
