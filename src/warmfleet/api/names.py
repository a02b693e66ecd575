"""Deterministic names and label keys derived from specs (so planning is idempotent).

Names joined with ``-`` from an endpoint's and its variants' names can collide across endpoints
(endpoint ``chat`` variant ``prod`` and endpoint ``chat-prod`` both name a Service
``chat-prod``): ``derived_names`` lists those an endpoint needs, and ``control.claims`` decides
which endpoint a contested name belongs to (the names are kept: renaming them would replace
every Deployment and Service of a running fleet).
"""

from __future__ import annotations

import hashlib

from warmfleet.api.resources import InferenceEndpointSpec, ModelSource
from warmfleet.cache.presigned import identity_uri

LABEL_PREFIX_WEIGHTS = "weights.warmfleet.dev/"
LABEL_PREFIX_IMAGE = "image.warmfleet.dev/"
READY_VALUE = "ready"
LABEL_ENDPOINT = "warmfleet.dev/endpoint"
LABEL_VARIANT = "warmfleet.dev/variant"
LABEL_REVISION = "warmfleet.dev/revision"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "warmfleet"
ENDPOINT_KIND = "InferenceEndpoint"
DEPLOYMENT = "Deployment"
SERVICE = "Service"
DAEMONSET = "DaemonSet"  # an image cache's puller (``puller_name``)
# The node protocol (operator <-> node agent), as Node annotations: the caches a node must hold
# (JSON list of {cache, uri, revision, hostPath}) and what it holds (JSON map cache -> report).
ANN_ASSIGNED = "warmfleet.dev/assigned-caches"
ANN_CACHE_STATUS = "warmfleet.dev/cache-status"


def short_hash(*parts: str, length: int = 8) -> str:
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()
    return digest[:length]


def source_key(source: ModelSource, host_path: str) -> str:
    """Content identity of a weights cache: the source URI (without the query parameters that
    sign a presigned URL: signing it again is not a new model), its revision and the node
    path."""
    return short_hash(identity_uri(source.uri), source.revision, host_path)


def revision(spec: InferenceEndpointSpec) -> str:
    """What a rollover is keyed on: model content, image, the weights host path and the node
    selector (moving to other nodes needs the weights there first, so it goes through the gate
    like a new model; an empty selector adds nothing, so such endpoints keep their names)."""
    weights = spec.model_cache_config.weights_cache
    parts = [
        identity_uri(spec.model_source.uri),
        spec.model_source.revision,
        spec.image,
        weights.host_path,
    ]
    if spec.node_selector:
        parts.append(",".join(f"{k}={v}" for k, v in sorted(spec.node_selector.items())))
    return short_hash(*parts)


def model_cache_name(endpoint: str, spec: InferenceEndpointSpec) -> str:
    """One weights cache per endpoint revision (AWS: one weights cache per parent). Other nodes
    (a new node selector) are another cache: the running revision's nodes keep theirs (and
    their ready labels) until the rollover ends, and the new one's gate starts from zero."""
    weights = spec.model_cache_config.weights_cache
    key = source_key(spec.model_source, weights.host_path)
    if spec.node_selector:  # (none: the name caches had before the selector counted)
        key = short_hash(key, ",".join(f"{k}={v}" for k, v in sorted(spec.node_selector.items())))
    return f"{endpoint}-w-{key}"


def image_cache_name(image: str, node_selector: dict[str, str]) -> str:
    """Shared by every endpoint with the same image and node selector."""
    selector = ",".join(f"{k}={v}" for k, v in sorted(node_selector.items()))
    return f"img-{short_hash(image, selector, length=12)}"


def puller_name(image_cache: str) -> str:
    """The DaemonSet that keeps an image cache's image pulled."""
    return f"{image_cache}-puller"


def deployment_name(endpoint: str, variant: str, rev: str) -> str:
    return f"{endpoint}-{variant}-{rev}"


def service_name(endpoint: str, variant: str | None = None) -> str:
    """The endpoint's Service (all its engines), or one variant's."""
    return endpoint if variant is None else f"{endpoint}-{variant}"


def derived_names(endpoint: str, spec: InferenceEndpointSpec) -> list[tuple[str, str]]:
    """(kind, name) of the objects the endpoint's current revision needs whose names another
    endpoint's may share: a Deployment per variant, its Service and each variant's. (Its weights
    cache's name cannot be shared: it ends in a fixed-length hash after ``-w-``.)"""
    rev = revision(spec)
    found = [(DEPLOYMENT, deployment_name(endpoint, v.name, rev)) for v in spec.variants]
    found.append((SERVICE, service_name(endpoint)))
    found += [(SERVICE, service_name(endpoint, v.name)) for v in spec.variants]
    return found


def weights_label(cache_name: str) -> str:
    return LABEL_PREFIX_WEIGHTS + cache_name


def image_label(cache_name: str) -> str:
    return LABEL_PREFIX_IMAGE + cache_name


def is_managed_label(key: str) -> bool:
    return key.startswith((LABEL_PREFIX_WEIGHTS, LABEL_PREFIX_IMAGE))
