"""What the reconciler reads: desired endpoints and the observed world (plain frozen values).

A backend (the kopf operator, the embedded local fleet, a test world) builds these from whatever
it watches, calls ``plan(desired, observed)`` and executes the returned actions. Nothing here
refers to Kubernetes objects: nodes, caches, deployments and replicas are backend-neutral.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from warmfleet.api import names
from warmfleet.api.resources import (
    CacheStatus,
    EndpointStatus,
    ImageCacheSpec,
    ImageCacheStatus,
    InferenceEndpointSpec,
    IntOrPercent,
    ModelCacheSpec,
)

_EMPTY: Mapping[str, str] = MappingProxyType({})


class NodeCacheState(StrEnum):
    """One cache on one node, as its node agent reports it."""

    PENDING = "pending"
    DOWNLOADING = "downloading"
    VERIFYING = "verifying"
    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class NodeCacheReport:
    state: NodeCacheState
    bytes_done: int = 0
    bytes_total: int = 0
    healthy: bool = True  # False: the agent found the data damaged or missing after READY
    message: str = ""

    @property
    def usable(self) -> bool:
        return self.state == NodeCacheState.READY and self.healthy


@dataclass(frozen=True, slots=True)
class ObservedNode:
    """A node, its labels, the weights caches assigned to it and what its agent reports.

    ``weights`` is keyed by ModelCache name; ``images`` by ImageCache name (reported by the image
    puller on that node). ``assigned`` is the set of ModelCache names the backend last told the
    node to hold (the agent fills assigned caches and evicts the others), from ``told``: the
    assignments themselves (``NodeCacheAssignment.key``: a source re-signed in place is told
    again).
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    ready: bool = True
    told: frozenset[tuple[str, str, str, str]] = frozenset()
    weights: Mapping[str, NodeCacheReport] = field(default_factory=dict)
    images: Mapping[str, NodeCacheReport] = field(default_factory=dict)

    @property
    def assigned(self) -> frozenset[str]:
        return frozenset(cache for cache, _uri, _revision, _path in self.told)

    def matches(self, selector: Mapping[str, str]) -> bool:
        return all(self.labels.get(k) == v for k, v in selector.items())


@dataclass(frozen=True, slots=True)
class ObservedModelCache:
    name: str
    spec: ModelCacheSpec
    created_s: float
    status: CacheStatus | None = None


@dataclass(frozen=True, slots=True)
class ObservedImageCache:
    name: str
    spec: ImageCacheSpec
    created_s: float
    status: ImageCacheStatus | None = None
    puller: bool = False  # the backend runs the image puller for this cache


@dataclass(frozen=True, slots=True)
class ObservedReplica:
    """One serving replica (a pod / an engine process)."""

    name: str
    node: str
    started_s: float
    ready_s: float | None = None
    prepared: bool = False  # its node held the weights when it started

    @property
    def ready(self) -> bool:
        return self.ready_s is not None


@dataclass(frozen=True, slots=True)
class ObservedDeployment:
    name: str
    endpoint: str
    variant: str
    revision: str
    replicas: int
    model_cache: str | None  # the ModelCache the replicas load from (None: origin only)
    image_cache: str | None
    spec_hash: str = ""  # DeploymentPlan.spec_hash() of what was applied
    pods: tuple[ObservedReplica, ...] = ()
    # its update strategy's (maxSurge, maxUnavailable); None: not observed (re-applied only
    # when something else changes)
    update_bounds: tuple[IntOrPercent, IntOrPercent] | None = None

    @property
    def ready_replicas(self) -> int:
        return sum(1 for p in self.pods if p.ready)


@dataclass(frozen=True, slots=True)
class DesiredEndpoint:
    """An InferenceEndpoint as the user declared it (plus deletion and autoscaler output)."""

    name: str
    spec: InferenceEndpointSpec
    uid: str = ""
    namespace: str = "default"
    deleting: bool = False
    autoscaled_replicas: Mapping[str, int] = field(default_factory=dict)  # variant -> replicas
    status: EndpointStatus | None = None


@dataclass(frozen=True, slots=True)
class HeldName:
    """An existing object with a name endpoints derive (``names.derived_names``) and who holds
    it: the endpoint that controls it (``uid`` empty: known by name only), or ``endpoint``
    ``None`` and ``owner`` saying what it is (an object warmfleet does not manage)."""

    kind: str
    name: str
    endpoint: str | None
    uid: str = ""
    owner: str = ""

    def owned_by(self, endpoint: str, uid: str) -> bool:
        return self.endpoint == endpoint and (not self.uid or not uid or self.uid == uid)

    def holder(self, claimant: str) -> str:
        """Who holds it, for people (``claimant``: the endpoint it was refused to; empty: no
        owner, an object warmfleet does not manage)."""
        if self.endpoint is None:
            return self.owner
        if self.endpoint == claimant:  # a deleted endpoint's of the same name, not yet collected
            return f"an earlier InferenceEndpoint {self.endpoint} (uid {self.uid})"
        return f"InferenceEndpoint {self.endpoint}"


@dataclass(frozen=True, slots=True)
class ObservedState:
    """``held``: existing objects beyond ``deployments`` (a backend's Services and ModelCaches,
    objects it does not manage) whose names endpoints derive (ImageCaches: only those warmfleet
    does not manage, its own are shared, ``claims.SHARED``); ``named_kinds``: the kinds of the
    objects the backend names after endpoints (``claims.needed_names``), those two endpoints
    may contest (caches of a kind listed there that no endpoint holds are not the plan's:
    ``claims.foreign``)."""

    now_s: float
    nodes: tuple[ObservedNode, ...] = ()
    model_caches: tuple[ObservedModelCache, ...] = ()
    image_caches: tuple[ObservedImageCache, ...] = ()
    deployments: tuple[ObservedDeployment, ...] = ()
    held: tuple[HeldName, ...] = ()
    named_kinds: frozenset[str] = frozenset({names.DEPLOYMENT})
    # the image caches (by name) whose puller DaemonSet warmfleet made, their ImageCache
    # observed or not (one gone, or someone else's now, leaves its puller to be deleted)
    pullers: frozenset[str] = frozenset()

    def node(self, name: str) -> ObservedNode | None:
        return next((n for n in self.nodes if n.name == name), None)

    def model_cache(self, name: str) -> ObservedModelCache | None:
        return next((c for c in self.model_caches if c.name == name), None)

    def image_cache(self, name: str) -> ObservedImageCache | None:
        return next((c for c in self.image_caches if c.name == name), None)
