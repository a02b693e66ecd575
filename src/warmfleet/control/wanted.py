"""What the fleet wants to exist, from the endpoints and the observed world (pure): the weights
caches (by name) and the image caches with their references (the refcount).

A live endpoint wants its revision's weights cache, unless another holder has that name
(``control.claims``: a ModelCache warmfleet does not manage, an earlier endpoint's of the same
name): then it has no weights cache until the name is free (nothing is written to that object,
nor assigned to nodes under its name). Likewise its image cache, unless an ImageCache of that
name is one warmfleet does not manage (nothing is written to it, no puller pulls for it, no node
is labelled for it; images never gate). Caches older revisions' Deployments still load from
stay wanted, as do the image references of endpoints the backend did not list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from warmfleet.api import names
from warmfleet.api.resources import ImageCacheSpec, ModelCacheSpec, ParentReference
from warmfleet.control.claims import IMAGE_CACHE, MODEL_CACHE, Conflicts, blocked
from warmfleet.control.observed import DesiredEndpoint, ObservedState


@dataclass(slots=True)
class Wanted:
    model_caches: dict[str, ModelCacheSpec] = field(default_factory=dict)
    image_images: dict[str, tuple[str, dict[str, str]]] = field(default_factory=dict)
    image_parents: dict[str, set[ParentReference]] = field(default_factory=dict)

    def want_image(
        self, cache: str, image: str, selector: dict[str, str], parent: ParentReference
    ) -> None:
        self.image_images.setdefault(cache, (image, selector))
        self.image_parents.setdefault(cache, set()).add(parent)

    def image_spec(self, cache: str) -> ImageCacheSpec:
        image, selector = self.image_images[cache]
        parents = sorted(self.image_parents[cache], key=lambda p: (p.namespace, p.name, p.uid))
        return ImageCacheSpec(image=image, node_selector=selector, parent_references=tuple(parents))


def parent(endpoint: DesiredEndpoint) -> ParentReference:
    return ParentReference(name=endpoint.name, namespace=endpoint.namespace, uid=endpoint.uid)


def wanted(
    endpoints: Sequence[DesiredEndpoint], observed: ObservedState, conflicts: Conflicts
) -> Wanted:
    result = Wanted()
    live = {e.name: e for e in endpoints if not e.deleting}
    for endpoint in live.values():
        spec = endpoint.spec
        cache_config = spec.model_cache_config
        cache = names.model_cache_name(endpoint.name, spec)
        image = names.image_cache_name(spec.image, spec.node_selector)
        mine = conflicts.get(endpoint.name, ())
        if cache_config.weights_cache.enabled and cache not in blocked(mine, MODEL_CACHE):
            result.model_caches[cache] = ModelCacheSpec(
                host_path=cache_config.weights_cache.host_path,
                model_source=spec.model_source,
                node_selector=dict(spec.node_selector),
                owner=endpoint.name,
            )
        if cache_config.image_cache.enabled and image not in blocked(mine, IMAGE_CACHE):
            result.want_image(image, spec.image, dict(spec.node_selector), parent(endpoint))
    _still_used(result, live, {e.name for e in endpoints}, observed)
    return result


def _still_used(
    result: Wanted, live: dict[str, DesiredEndpoint], listed: set[str], observed: ObservedState
) -> None:
    for deployment in observed.deployments:  # caches still used by older revisions stay
        endpoint_or_none = live.get(deployment.endpoint)
        if endpoint_or_none is None and deployment.endpoint in listed:
            continue  # deleting: its Deployments go in this pass, its caches after them
        model = observed.model_cache(deployment.model_cache or "")
        if model is not None and deployment.model_cache not in result.model_caches:
            result.model_caches[model.name] = model.spec
        image = observed.image_cache(deployment.image_cache or "")
        if image is None:
            continue
        # an endpoint the backend did not list (e.g. its spec no longer validates) keeps the
        # references it had: only a deleting endpoint gives its caches up
        parents = (
            [parent(endpoint_or_none)]
            if endpoint_or_none is not None
            else [p for p in image.spec.parent_references if p.name == deployment.endpoint]
        )
        for ref in parents:
            result.want_image(image.name, image.spec.image, dict(image.spec.node_selector), ref)
