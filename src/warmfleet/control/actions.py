"""What the reconciler asks a backend to do. Every action is idempotent (level-triggered).

A backend executes them in list order. The Kubernetes operator maps them to API calls; the
embedded local backend maps them to node agents, engine processes and its own label table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from warmfleet.api.names import short_hash
from warmfleet.api.resources import (
    CacheStatus,
    EndpointStatus,
    ImageCacheSpec,
    ImageCacheStatus,
    IntOrPercent,
    ModelCacheSpec,
    ModelSource,
)


@dataclass(frozen=True, slots=True)
class NodeAffinityPreference:
    """Prefer nodes carrying ``label`` (=ready) with this scheduling ``weight`` (1-100)."""

    label: str
    weight: int


@dataclass(frozen=True, slots=True)
class DeploymentPlan:
    """One serving Deployment: a variant of an endpoint at one revision."""

    name: str
    endpoint: str
    variant: str
    revision: str
    replicas: int
    image: str
    port: int
    command: tuple[str, ...]
    args: tuple[str, ...]
    gpus_per_replica: int
    model_source: ModelSource
    model_cache: str | None  # load from this node cache when present, else from the origin
    host_path: str | None
    image_cache: str | None
    node_selector: Mapping[str, str]
    preferences: tuple[NodeAffinityPreference, ...]
    # the Deployment's own update strategy (maxSurge, maxUnavailable) for in-place changes; not
    # in the spec hash: it is no part of the pod template, changing it restarts nothing
    update_bounds: tuple[IntOrPercent, IntOrPercent] = (1, 0)

    def spec_hash(self) -> str:
        """Identity of everything but ``replicas`` (scaling is not a new spec). Routing is
        not part of it, nor of the plan: it is the gateway's business, read from the
        InferenceEndpoint, and changing it must not restart the engines (their KV caches)."""
        payload = {
            "image": self.image,
            "port": self.port,
            "command": list(self.command),
            "args": list(self.args),
            "gpus": self.gpus_per_replica,
            "source": self.model_source.model_dump(mode="json"),
            "cache": self.model_cache,
            "host_path": self.host_path,
            "image_cache": self.image_cache,
            "selector": dict(sorted(self.node_selector.items())),
            "prefs": [(p.label, p.weight) for p in self.preferences],
        }
        return short_hash(json.dumps(payload, sort_keys=True), length=12)


@dataclass(frozen=True, slots=True)
class NodeCacheAssignment:
    """One weights cache a node agent must hold."""

    cache: str
    source: ModelSource
    host_path: str

    def key(self) -> tuple[str, str, str, str]:
        """What the node is told (``ObservedNode.told``): any change is told again."""
        return (self.cache, self.source.uri, self.source.revision, self.host_path)


@dataclass(frozen=True, slots=True)
class ApplyModelCache:
    name: str
    spec: ModelCacheSpec


@dataclass(frozen=True, slots=True)
class DeleteModelCache:
    name: str


@dataclass(frozen=True, slots=True)
class ApplyImageCache:
    name: str
    spec: ImageCacheSpec  # with the full, current parentReferences (the refcount)


@dataclass(frozen=True, slots=True)
class DeleteImageCache:
    name: str


@dataclass(frozen=True, slots=True)
class ApplyImagePuller:
    """Keep ``image`` pulled (and in use, so image GC keeps it) on nodes matching the selector."""

    cache: str
    image: str
    node_selector: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class DeleteImagePuller:
    cache: str


@dataclass(frozen=True, slots=True)
class AssignNodeCaches:
    """The complete set of weights caches ``node`` must hold; anything else is evicted."""

    node: str
    caches: tuple[NodeCacheAssignment, ...]


@dataclass(frozen=True, slots=True)
class SetNodeLabels:
    """Set these readiness labels on ``node`` and remove ``remove``."""

    node: str
    set_labels: Mapping[str, str] = field(default_factory=dict)
    remove: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ApplyDeployment:
    plan: DeploymentPlan


@dataclass(frozen=True, slots=True)
class ScaleDeployment:
    """Set a Deployment's replica count only (an old revision's, during a rolling rollout)."""

    name: str
    replicas: int


@dataclass(frozen=True, slots=True)
class DeleteDeployment:
    name: str


@dataclass(frozen=True, slots=True)
class UpdateEndpointStatus:
    name: str
    status: EndpointStatus


@dataclass(frozen=True, slots=True)
class UpdateModelCacheStatus:
    name: str
    status: CacheStatus


@dataclass(frozen=True, slots=True)
class UpdateImageCacheStatus:
    name: str
    status: ImageCacheStatus


@dataclass(frozen=True, slots=True)
class ReleaseEndpoint:
    """Garbage collection of a deleted endpoint is complete: drop its finalizer."""

    name: str


Action = (
    ApplyModelCache
    | DeleteModelCache
    | ApplyImageCache
    | DeleteImageCache
    | ApplyImagePuller
    | DeleteImagePuller
    | AssignNodeCaches
    | SetNodeLabels
    | ApplyDeployment
    | ScaleDeployment
    | DeleteDeployment
    | UpdateEndpointStatus
    | UpdateModelCacheStatus
    | UpdateImageCacheStatus
    | ReleaseEndpoint
)
